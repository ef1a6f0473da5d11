"""strategy.sync_batchnorm=true on CPU workers (framework/strategies/mesh/sync_batchnorm.py), on a persistent gloo world:
ddp's converted BatchNorm gives each rank exactly its rows of what one process computes on the whole batch (outputs,
loss), DDP's averaged gradients equal that process's, and every rank's running statistics are its statistics. Torch's
own SyncBatchNorm refuses CPU tensors (its kernels are GPU-only): without the CPU forward this fails on the first
forward. A world of one: tests/unit/test_sync_batchnorm.py."""
import torch
from torch import nn

CPU = torch.device("cpu")


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 36, 5),
                                  nn.BatchNorm1d(5))

    def forward(self, x):
        return self.body(x)


def _batch():
    g = torch.Generator().manual_seed(7)
    return torch.randn(8, 3, 8, 8, generator=g) * 3 + 1, torch.randint(0, 5, (8,), generator=g)


def _one_process() -> tuple:
    torch.manual_seed(0)
    model = _Net()
    x, y = _batch()
    out = model(x)
    nn.functional.cross_entropy(out, y).backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, {
        n: b.clone() for n, b in model.named_buffers()}


def _ddp_step(rank: int, world: int) -> tuple:
    from support.driver import strategy_for
    from framework.strategies.groups import TorchGroup

    torch.manual_seed(0)
    model = _Net()
    strategy = strategy_for("strategy=ddp", "strategy.sync_batchnorm=true", "trainer.accelerator=cpu")
    wrapped = strategy.parallelize(model, lambda params: torch.optim.SGD(params, lr=0.1),
                                   TorchGroup(rank, rank, world, CPU))
    x, y = _batch()
    out = wrapped.model(x[rank::world])
    nn.functional.cross_entropy(out, y[rank::world]).backward()
    module = wrapped.module
    kinds = {type(m).__name__ for m in module.modules()}
    return (out.detach(), {n: p.grad.clone() for n, p in module.named_parameters()},
            {n: b.clone() for n, b in module.named_buffers()}, kinds)


def test_ddp_with_sync_batchnorm_on_cpu_workers_computes_what_one_process_does(world2):
    outputs, grads, buffers = _one_process()
    for rank, (out, rank_grads, rank_buffers, kinds) in enumerate(world2.run(_ddp_step)):
        assert "CpuSyncBatchNorm" in kinds and "BatchNorm2d" not in kinds
        torch.testing.assert_close(out, outputs[rank::2], rtol=1e-5, atol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(rank_grads[name], grad, rtol=1e-5, atol=1e-6, msg=f"rank {rank}: {name}")
        for name, buffer in buffers.items():  # running mean and (unbiased) variance, batches tracked
            torch.testing.assert_close(rank_buffers[name], buffer, rtol=1e-5, atol=1e-6, msg=f"rank {rank}: {name}")
        assert rank_buffers["body.1.num_batches_tracked"].item() == 1
