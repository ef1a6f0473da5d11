"""optimizer=muon under ddp on a persistent gloo world: the framework's ddp engine with the Muon + AdamW optimizer its
plan builds trains the char LM's GPT, each rank on its half of every batch, to the weights of one process that
steps the mean of the two halves' gradients, bit for bit, and to the losses of one process stepping the whole batch.
Against that whole-batch process the weights differ only by its own rounding drift (the same batch's gradient summed
in another order, which Muon's bf16 Newton-Schulz can round differently): the gap between the two one-process runs.
A rank stepping its own half's gradient misses by about a whole step."""
import torch
from torch import nn

from framework.config.optimizer import MuonConfig
from framework.models.gpt import GPT
from framework.training.optim import build_optimizer
from framework.training.param_groups import ParamGroups

CPU = torch.device("cpu")
STEPS, BATCH, LR = 4, 8, 0.01


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(in_shape=(16,), num_classes=11, n_layer=2, n_head=2, n_embd=16)


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randint(0, 11, (BATCH, 16), generator=g), torch.randint(0, 11, (BATCH, 16), generator=g))
            for _ in range(STEPS)]


def _loss(model, x, y) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


def _make_optimizer(model: nn.Module):
    options = MuonConfig(lr=LR)
    groups = ParamGroups.of(options, model)
    return lambda params, names=None: build_optimizer(options, params, 1, groups, names)


def _one_process() -> tuple[list[float], dict[str, torch.Tensor]]:
    model = _model()
    optimizer = _make_optimizer(model)(model.parameters())
    losses = []
    for x, y in _batches():
        loss = _loss(model, x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def _halves(world: int) -> dict[str, torch.Tensor]:
    """One process whose gradient is the mean of the ranks' shares' gradients: DDP's sum in DDP's order."""
    model = _model()
    optimizer = _make_optimizer(model)(model.parameters())
    for x, y in _batches():
        shares = []
        for rank in range(world):
            _loss(model, x[rank::world], y[rank::world]).backward()
            shares.append([p.grad / world for p in model.parameters()])
            optimizer.zero_grad()
        for p, *grads in zip(model.parameters(), *shares):
            p.grad = sum(grads[1:], grads[0])
        optimizer.step()
        optimizer.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _ddp(rank: int, world: int) -> tuple:
    from framework.strategies.groups import TorchGroup
    from support.driver import strategy_for

    model = _model()
    strategy = strategy_for("strategy=ddp", "trainer.accelerator=cpu")
    wrapped = strategy.parallelize(model, _make_optimizer(model), TorchGroup(rank, rank, world, CPU))
    losses = []
    for x, y in _batches():
        loss = _loss(wrapped.model, x[rank::world], y[rank::world])
        loss.backward()
        wrapped.optimizer.step()
        wrapped.optimizer.zero_grad()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean)
        losses.append(mean.item() / world)
    kinds = [type(wrapped.optimizer).__name__, type(wrapped.model).__name__]
    weights = {n: p.detach().clone() for n, p in wrapped.module.named_parameters()}
    return losses, weights, _halves(world), kinds  # the reference in the ranks' own process: same threads, kernels


def test_ddp_with_muon_trains_the_gpt_as_one_process_does(world2):
    losses, whole_batch = _one_process()
    for rank_losses, weights, halves, kinds in world2.run(_ddp):
        assert kinds == ["MuonWithAdamW", "DistributedDataParallel"]
        torch.testing.assert_close(rank_losses, losses, rtol=1e-5, atol=0)
        for name, weight in weights.items():
            assert torch.equal(weight, halves[name]), name
        # what separates it from the whole-batch process is that process's own drift, a few % of a step at most
        start = dict(_model().named_parameters())
        for name, weight in weights.items():
            moved = (whole_batch[name] - start[name]).abs().max().item()
            assert (weight - whole_batch[name]).abs().max().item() <= 0.1 * moved, name
