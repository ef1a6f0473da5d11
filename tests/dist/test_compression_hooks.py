"""strategy.compression's hooks on two gloo ranks (a persistent world, support/gloo_world.py): the bytes each rank
hands to its all-reduces, the gradients against uncompressed DDP's, PowerSGD's bytes against the factors its hook
really all-reduces, and its state carried by parameter into a DDP whose buckets are laid out otherwise (what a
resumed run's first step meets). FSDP2's bf16 reduce-scatter likewise."""
import copy
import math

import pytest
import torch
from torch import nn

CPU = torch.device("cpu")


def _mlp() -> nn.Module:
    """Matrices of repeated shapes between others (PowerSGD groups its factors by shape), and biases it leaves whole."""
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))


def _lenet() -> nn.Module:
    from framework.models.lenet import LeNet

    return LeNet((1, 28, 28), 10)


def _batches(model_name: str, rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    shape = (8, 16) if model_name == "mlp" else (8, 1, 28, 28)
    classes = 4 if model_name == "mlp" else 10
    return [(torch.randn(shape, generator=g), torch.randint(0, classes, (8,), generator=g)) for _ in range(steps)]


def _wrapped(model: nn.Module, compression: str | None, **powersgd):
    """DDP with the hook strategy=ddp registers (None: DDP's own all-reduce, no hook)."""
    from framework.config.strategy_options import PowerSGDOptions
    from framework.strategies.mesh.ddp_hooks import GradientHook, gradient_hook

    ddp = nn.parallel.DistributedDataParallel(model)
    hook = None
    if compression is not None:
        hook = GradientHook(compression, PowerSGDOptions(**powersgd), list(model.parameters()))
        ddp.register_comm_hook(hook, gradient_hook)
    return ddp, hook


def _step(ddp, batch, optimizer=None) -> list[torch.Tensor]:
    """One forward and backward (and the optimizer's step, if given); the averaged gradients."""
    ddp.zero_grad(set_to_none=True)
    x, y = batch
    nn.functional.cross_entropy(ddp(x), y).backward()
    grads = [p.grad.clone() for p in ddp.module.parameters()]
    if optimizer is not None:
        optimizer.step()
    return grads


def _sent_and_gradients(rank: int, world: int, compression: str, model_name: str):
    """Two steps under `compression` and under DDP's own all-reduce from the same weights: bytes sent and weighed per
    step, the parameters' element count, and the relative gradient error per parameter."""
    torch.manual_seed(0)
    model = _mlp() if model_name == "mlp" else _lenet()
    plain, _ = _wrapped(copy.deepcopy(model), None)
    compressed, hook = _wrapped(model, compression)
    errors, sent, full = [], [], []
    for batch in _batches(model_name, rank, 2):
        hook.traffic.reset()
        expected, got = _step(plain, batch), _step(compressed, batch)
        errors.append([float((g - e).norm() / e.norm()) for g, e in zip(got, expected)])
        sent.append(hook.traffic.sent)
        full.append(hook.traffic.uncompressed)
    return sent, full, sum(p.numel() for p in model.parameters()), errors


def test_none_is_ddps_own_all_reduce_to_the_bit_and_counts_four_bytes_a_gradient(world2):
    for sent, full, numel, errors in world2.run(_sent_and_gradients, "none", "lenet"):
        assert sent == full == [4 * numel] * 2
        assert all(e == 0.0 for step in errors for e in step)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_sends_half_the_bytes_within_a_percent_of_fp32(world2, dtype):
    for sent, full, numel, errors in world2.run(_sent_and_gradients, dtype, "lenet"):
        assert sent == [2 * numel] * 2 and full == [4 * numel] * 2
        assert max(e for step in errors for e in step) < 1e-2
        assert max(e for step in errors for e in step) > 0  # it did travel rounded


def _powersgd_bytes(rank: int, world: int, matrix_rank: int):
    """Four steps of LeNet, PowerSGD from step 3: bytes per step, and what its hook really all-reduced at step 4 (its
    P and Q buffers, and the tensors it leaves whole), in elements."""
    from framework.strategies.mesh.ddp_hooks import factors

    torch.manual_seed(0)
    model = _lenet()
    ddp, hook = _wrapped(model, "powersgd", rank=matrix_rank, start_step=3)
    sent = []
    for batch in _batches("lenet", rank, 4):
        hook.traffic.reset()
        _step(ddp, batch)
        sent.append(hook.traffic.sent)
    state = hook.powersgd
    [bucket] = state.q_memory_dict  # LeNet's gradients fit one bucket
    shapes = [model.get_parameter(name).shape for name in _bucket_order(model, hook, bucket)]
    compressed = {position for position, *_ in factors(shapes, matrix_rank)}
    whole = sum(s.numel() for i, s in enumerate(shapes) if i not in compressed)
    factor_elements = state.p_memory_dict[bucket].numel() + state.q_memory_dict[bucket].numel()
    ours = sum((n + m) * r for _, n, m, r in factors(shapes, matrix_rank))
    return sent, sum(p.numel() for p in model.parameters()), whole + factor_elements, ours, factor_elements


def _bucket_order(model: nn.Module, hook, bucket: int) -> list[str]:
    names = [name for name, _ in model.named_parameters()]
    return [names[i] for i in hook.layouts[bucket]]


@pytest.mark.parametrize("matrix_rank", [1, 2])
def test_powersgd_counts_the_factors_its_hook_all_reduces_and_plain_steps_before_its_start(world2, matrix_rank):
    for sent, numel, really, ours, factor_elements in world2.run(_powersgd_bytes, matrix_rank):
        assert sent[:2] == [4 * numel] * 2, "steps 1 and 2: the plain all-reduce"
        assert sent[2] == sent[3] == 4 * really, "steps 3 and 4: what the hook handed its all-reduces"
        assert ours == factor_elements, "factors(): the P and Q layout torch's hook uses"
        assert 4 * numel / sent[3] >= (20 if matrix_rank == 1 else 10)


def _resumed_step(rank: int, world: int, carry_state: bool):
    """PowerSGD (rank 2, from step 3) trains 5 steps; then a new DDP of the same weights, whose buckets start in
    their first layout (DDP rebuilds them after its first step, in the order gradients became ready), gets the
    state by parameter (every rank's, as a checkpoint holds it) or not. Step 6's gradients of both, and what the
    state load said."""
    torch.manual_seed(0)
    model = _mlp()
    ddp, hook = _wrapped(model, "powersgd", rank=2, start_step=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _batches("mlp", rank, 6)
    for batch in batches[:5]:
        _step(ddp, batch, optimizer)
    saved = hook.state_dict()  # what this rank writes into a checkpoint
    resumed, resumed_hook = _wrapped(copy.deepcopy(model), "powersgd", rank=2, start_step=3)
    said = resumed_hook.load_state_dict(saved if carry_state else None, world, world, step=5)
    first_layout = tuple(resumed_hook.index[id(p)] for p in resumed.module.parameters())
    expected, got = _step(ddp, batches[5]), _step(resumed, batches[5])
    return expected, got, said, hook.layouts[0], first_layout


def test_powersgd_state_follows_the_parameters_into_another_bucket_layout(world2):
    for expected, got, said, rebuilt, first in world2.run(_resumed_step, True):
        assert said == ""
        assert sorted(rebuilt) == sorted(first) and rebuilt != first, "the resumed DDP's buckets are laid out otherwise"
        for e, g in zip(expected, got):
            torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-8)


def test_without_its_state_the_resumed_step_differs(world2):
    """The check above can fail: a PowerSGD step without the error feedback and warm start it had is another step."""
    for expected, got, said, _, _ in world2.run(_resumed_step, False):
        assert "PowerSGD goes on from step 6 with no error feedback and fresh factors" in said
        assert max(float((g - e).abs().max()) for e, g in zip(expected, got)) > 1e-4


def _fsdp_step(rank: int, world: int, compression: str):
    """One step of LeNet under strategy=fsdp: the bytes its reduce-scatters were handed and weighed, and the
    gradients made whole."""
    from framework.strategies.mesh.dims import MeshGroup
    from framework.training.instrument import gradient_traffic
    from support.driver import strategy_for

    torch.manual_seed(0)
    strategy = strategy_for("strategy=fsdp", "trainer.accelerator=cpu", f"strategy.compression={compression}")
    wrapped = strategy.parallelize(_lenet(), lambda params, **_: torch.optim.SGD(params, lr=0.1),
                                   MeshGroup(rank, rank, world, CPU).on_mesh(strategy.dims))
    traffic = gradient_traffic(wrapped)
    x, y = _batches("lenet", rank, 1)[0]
    nn.functional.cross_entropy(wrapped.model(x), y).backward()
    grads = [p.grad.full_tensor().clone() for p in wrapped.model.parameters()]
    return traffic.sent, traffic.uncompressed, grads, [p.grad.dtype for p in wrapped.model.parameters()]


def test_fsdp_bf16_reduce_scatters_half_the_bytes_within_a_percent_and_keeps_fp32_gradients(world2):
    plain, bf16 = world2.run(_fsdp_step, "none"), world2.run(_fsdp_step, "bf16")
    for (sent, full, grads, _), (bf16_sent, bf16_full, bf16_grads, dtypes) in zip(plain, bf16):
        assert sent == full == bf16_full > 0 and bf16_sent * 2 == sent
        assert set(dtypes) == {torch.float32}
        errors = [float((b - g).norm() / g.norm()) for g, b in zip(grads, bf16_grads)]
        assert 0 < max(errors) < 1e-2


def _many_buckets(rank: int, world: int):
    """Six steps of a 1.6M-parameter MLP in 1 MB buckets, PowerSGD from step 3: the averaged gradients (the same on
    every rank, or the ranks' collectives went out of order)."""
    import torch.distributed as dist

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 4))
    from framework.config.strategy_options import PowerSGDOptions
    from framework.strategies.mesh.ddp_hooks import GradientHook, gradient_hook

    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    hook = GradientHook("powersgd", PowerSGDOptions(rank=2, start_step=3), list(model.parameters()))
    ddp.register_comm_hook(hook, gradient_hook)
    g = torch.Generator().manual_seed(rank)
    for _ in range(6):
        grads = _step(ddp, (torch.randn(8, 256, generator=g), torch.randint(0, 4, (8,), generator=g)))
    mine = torch.cat([t.flatten() for t in grads])
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    return len(hook.layouts), all(torch.equal(everyone[0], other) for other in everyone)


def test_powersgd_over_several_buckets_keeps_the_ranks_collectives_in_order_on_gloo(world2):
    """torch's hook makes two of its three all-reduces from gloo's callback threads: two buckets in flight at once
    ordered them differently on the two ranks (gloo aborts: "Received data size doesn't match expected size")."""
    for buckets, same in world2.run(_many_buckets):
        assert buckets >= 2 and same


def _one_overflow(rank: int, world: int, compression: str):
    """Eight steps of the MLP, PowerSGD (rank 2) from step 3, and at step 4 rank 0's loss times inf (a GradScaler
    overflow, or a non-finite step trainer.on_nonfinite=skip skips): whether each step's averaged gradients were
    finite, and whether the ranks' agreed. A step with non-finite gradients is skipped, as the loop skips it."""
    import torch.distributed as dist

    torch.manual_seed(0)
    model = _mlp()
    ddp, _ = _wrapped(model, compression, **({"rank": 2, "start_step": 3} if compression == "powersgd" else {}))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    finite, same = [], []
    for step, (x, y) in enumerate(_batches("mlp", rank, 8), start=1):
        ddp.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x), y)
        (loss * (math.inf if step == 4 and rank == 0 else 1.0)).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        finite.append(bool(torch.isfinite(grads).all()))
        if finite[-1]:
            optimizer.step()
        everyone = [torch.empty_like(grads) for _ in range(world)]
        dist.all_gather(everyone, grads)
        same.append(all(torch.equal(everyone[0], other) for other in everyone) if finite[-1] else None)
    return finite, same


@pytest.mark.parametrize("compression", ["none", "fp16", "powersgd"])
def test_one_non_finite_step_leaves_the_next_steps_finite(world2, compression):
    """torch's PowerSGD hook adds the error feedback to every later gradient and warm-starts from Q: without
    recover() one inf made steps 4-8 non-finite (every later step skipped) under powersgd, not under none or fp16."""
    for finite, same in world2.run(_one_overflow, compression):
        assert finite == [True, True, True, False, True, True, True, True]
        assert all(s for s in same if s is not None), "the ranks' gradients agree after the redraw"


def _synchronizes(rank: int, world: int, bucket_cap_mb: float):
    """Four steps of a 1.6M-parameter MLP, PowerSGD from step 3, with CUDA reported available and
    torch.cuda.synchronize counted (the CPU buckets' device is never synchronized): the synchronizations of each
    step, and the gradient buckets."""
    from unittest import mock

    from framework.config.strategy_options import PowerSGDOptions
    from framework.strategies.mesh.ddp_hooks import GradientHook, gradient_hook

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 4))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    hook = GradientHook("powersgd", PowerSGDOptions(rank=2, start_step=3), list(model.parameters()))
    ddp.register_comm_hook(hook, gradient_hook)
    g = torch.Generator().manual_seed(rank)
    counts = []
    with mock.patch("torch.cuda.is_available", return_value=True), mock.patch("torch.cuda.synchronize") as sync:
        for _ in range(4):
            sync.reset_mock()
            _step(ddp, (torch.randn(8, 256, generator=g), torch.randint(0, 4, (8,), generator=g)))
            counts.append(sync.call_count)
    return counts, len(hook.layouts)


def test_powersgd_synchronizes_the_device_once_per_bucket_where_cuda_is_available(world2):
    """torch's powerSGD_hook ends each bucket with torch.cuda.synchronize whenever CUDA is available: on NCCL the
    backward waits for every bucket's reduction (docs/strategies.md), so fewer, larger buckets wait less often."""
    for (small, buckets), (large, one) in zip(world2.run(_synchronizes, 1), world2.run(_synchronizes, 100)):
        assert buckets >= 2 and one == 1
        assert small == [0, 0, buckets, buckets], "none before its start, then one per bucket"
        assert large == [0, 0, 1, 1]


def _checkpointed(rank: int, world: int, folder: str):
    """strategy=ddp with PowerSGD (rank 2, from step 3) trains 5 steps and the loop's Checkpointer saves; a fresh
    DDP of the same start resumes from it, and from the same checkpoint in the format written before each rank wrote
    its own piece (every rank's state in the one file). What the checkpoint's files hold, and step 6's gradients of
    the three."""
    import json
    from pathlib import Path

    import torch.distributed as dist

    from framework.checkpoints.position import Position
    from framework.checkpoints.store import Checkpoint, engine_folder, load_checkpoint, save_checkpoint
    from framework.config.trainer import TrainerConfig
    from framework.strategies.groups import TorchGroup
    from framework.training.checkpointing import Checkpointer
    from support.driver import strategy_for

    _KEEP_TWO = TrainerConfig(checkpoint_every_n_steps=None, keep_checkpoints=2, batch_size=16)
    strategy = strategy_for("strategy=ddp", "trainer.accelerator=cpu", "strategy.compression=powersgd",
                            "strategy.powersgd.rank=2", "strategy.powersgd.start_step=3")
    group = TorchGroup(rank, rank, world, CPU)
    torch.manual_seed(0)
    start = _mlp()

    def wrapped_from(model):
        return strategy.parallelize(copy.deepcopy(model), lambda params: torch.optim.SGD(params, lr=0.1), group)

    trained = wrapped_from(start)
    batches = _batches("mlp", rank, 6)
    for batch in batches[:5]:
        _step(trained.model, batch, trained.optimizer)
    checkpointer = Checkpointer(group, Path(folder) / "new", _KEEP_TWO, {}, lambda line: None)
    path = checkpointer.save(trained, Position(5, 0, 80, 16), {}, {})
    checkpoint = Checkpoint(path, json.loads(path.with_suffix(".json").read_text()))
    in_file = load_checkpoint(checkpoint)["engine"]
    pieces = sorted(p.name for p in engine_folder(path).iterdir())
    mine = trained.engine_state()
    every = [None] * world
    dist.all_gather_object(every, mine)
    old = Path(folder) / "old" / "checkpoints"
    if rank == 0:  # what a checkpoint held before: every rank's state in the one file, no pieces
        state = {**load_checkpoint(checkpoint), "engine": every}
        manifest = {k: v for k, v in checkpoint.manifest.items() if k not in ("engine", "file", "bytes", "sha256")}
        save_checkpoint(old, state, manifest, keep=1)
    dist.barrier()
    old_path = old / path.name
    old_checkpoint = Checkpoint(old_path, json.loads(old_path.with_suffix(".json").read_text()))
    expected = _step(trained.model, batches[5])
    got = []
    for saved in (checkpoint, old_checkpoint):
        resumed = wrapped_from(start)
        Checkpointer(group, Path(folder) / "resumed", _KEEP_TWO, {}, lambda line: None).resume(saved, resumed)
        got.append(_step(resumed.model, batches[5]))
    return in_file, pieces, checkpoint.manifest["engine"], expected, got


def test_each_rank_writes_and_reads_its_own_powersgd_piece_and_old_checkpoints_still_load(world2, tmp_path):
    """No rank gathers another's error feedback (as large as the gradients): each writes its piece beside the
    checkpoint, listed in the manifest, and reads its own back; the resumed step equals the uninterrupted one."""
    for in_file, pieces, listed, expected, got in world2.run(_checkpointed, str(tmp_path)):
        assert in_file is None and pieces == ["rank0.pt", "rank1.pt"]
        assert sorted(listed["files"]) == pieces and listed["holds"].startswith("PowerSGD's error feedback")
        for resumed in got:  # from each rank's piece, and from the format before
            for e, g in zip(expected, resumed):
                torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-8)
