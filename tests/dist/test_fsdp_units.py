"""fully_shard's units on two gloo ranks (a persistent world, support/gloo_world.py): activation checkpointing inside
the units of a model with dropout changes nothing a step computes (the recomputation draws the same masks); the
sharded gradients' norm is the global one, as one process would measure it."""
import pytest
import torch

CPU = torch.device("cpu")


def _fsdp_step(rank: int, world: int, recompute: bool):
    """One forward and backward of a small GPT (dropout 0.1) sharded by strategy=fsdp over the world, the units
    recomputed in backward or not: this rank's loss, every gradient made whole, and the clipping norm."""
    from framework.models.gpt import GPT
    from framework.strategies.mesh.dims import MeshGroup
    from framework.training.speedups import apply_speedups
    from support.driver import strategy_for

    torch.manual_seed(0)
    model = GPT((16,), 20, n_layer=2, n_head=2, n_embd=16, dropout=0.1)
    strategy = strategy_for("strategy=fsdp", "trainer.accelerator=cpu")
    if recompute:
        apply_speedups(model, False, CPU, checkpointed=strategy.speedup_modules(model).recomputed)
    wrapped = strategy.parallelize(model, lambda params, **_: torch.optim.SGD(params, lr=0.1),
                                   MeshGroup(rank, rank, world, CPU).on_mesh(strategy.dims))
    tokens = torch.randint(0, 20, (4, 16), generator=torch.Generator().manual_seed(rank))
    torch.manual_seed(1 + rank)  # this rank's dropout masks
    logits = wrapped.model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten())
    loss.backward()
    norm = wrapped.precision.clip_grad_norm(wrapped.model, wrapped.optimizer, None)
    grads = {name: p.grad.full_tensor().clone() for name, p in wrapped.model.named_parameters()}
    return loss.item(), grads, float(norm)


def test_recomputed_units_with_dropout_give_the_same_loss_and_gradients(world2):
    plain, recomputed = world2.run(_fsdp_step, False), world2.run(_fsdp_step, True)
    for rank, ((loss_a, grads_a, norm_a), (loss_b, grads_b, norm_b)) in enumerate(zip(plain, recomputed)):
        assert loss_b == pytest.approx(loss_a, rel=1e-6), f"rank {rank}"
        assert list(grads_b) == list(grads_a), "no _checkpoint_wrapped_module. in the names"
        for name, grad in grads_a.items():
            torch.testing.assert_close(grads_b[name], grad, rtol=1e-5, atol=1e-7, msg=f"rank {rank}: {name}")
        assert norm_b == pytest.approx(norm_a, rel=1e-6)
    assert plain[0][0] != plain[1][0], "each rank had its own batch"
    norms = {norm for _, _, norm in plain}
    assert len(norms) == 1, "every rank measures the same, global norm"
    whole = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in plain[0][1].values()]))
    assert norms.pop() == pytest.approx(float(whole), rel=1e-5)


def _accumulated_gradient(rank: int, world: int, compression: str, precision: str) -> list[float]:
    """strategy=fsdp's gradient of a bias-free Linear(2, 2) after 8 micro-batches, the first 7 without sync (as
    trainer.grad_accum=8 runs them): the first micro-batch's gradient is 1 in every element, each later one's 2^-9,
    below bf16's resolution at 1 (2^-7). Summed in fp32 and cast once for the wire: 1 + 7 x 2^-9 rounds to
    1 + 2^-6; summed in bf16 each 2^-9 is lost and the sum stays 1."""
    from framework.strategies.mesh.dims import MeshGroup
    from support.driver import strategy_for

    torch.manual_seed(0)
    strategy = strategy_for("strategy=fsdp", "trainer.accelerator=cpu", f"strategy.compression={compression}",
                            f"trainer.precision={precision}")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False))
    wrapped = strategy.parallelize(model, lambda params, **_: torch.optim.SGD(params, lr=0.1),
                                   MeshGroup(rank, rank, world, CPU).on_mesh(strategy.dims))
    for micro_batch in range(8):
        wrapped.gradient_sync(micro_batch == 7)
        x = torch.full((1, 2), 1.0 if micro_batch == 0 else 2.0 ** -9)
        wrapped.model(x).float().sum().backward()
    return sorted(set(wrapped.model[0].weight.grad.full_tensor().flatten().tolist()))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fsdp_bf16_compression_accumulates_micro_batches_in_fp32_and_casts_only_for_the_wire(world2, precision):
    """FSDP2 holds an accumulation's gradients in its reduce_dtype between micro-batches: with reduce_dtype=bf16
    (strategy.compression=bf16 until issue 55) the 7 small gradients vanished from the sum."""
    fp32_sum = 1 + 7 * 2.0 ** -9
    assert world2.run(_accumulated_gradient, "none", precision) == [[fp32_sum]] * 2
    assert world2.run(_accumulated_gradient, "bf16", precision) == [[1 + 2.0 ** -6]] * 2
