"""The CUDA paths, in this process: what a CPU can show runs everywhere; what needs GPUs is marked gpu and skips where
the machine has fewer GPUs than it needs (select them with `pytest -m gpu`, or `make test-gpu` for these plus the smoke
matrix). The CUDA paths of real runs: tests/runs/test_cuda_paths.py."""
import os
import random
import threading

import numpy as np
import pytest
import torch
from torch import nn

from framework.checkpoints.state import restore_rng, rng_state
from framework.checkpoints.store import load_checkpoint, save_checkpoint
from framework.strategies.dp import Replica
from framework.telemetry.replica_clock import ReplicaClock
from framework.training.precision import Precision
from support.driver import strategy_for
from support.marks import needs_gpus
from support.processes import slurm_task


def _draws():
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_rng_states_come_back_from_a_checkpoint_file_as_usable_cpu_tensors(tmp_path):
    """Checkpoints are always read into CPU memory (a GPU-mapped read gave CUDA RNG tensors, and every resume on
    a GPU crashed in torch.set_rng_state); the restored streams continue exactly where they were saved."""
    state = {"rng": [rng_state()]}
    expected = _draws()
    saved = save_checkpoint(tmp_path, state, {"step": 1}, keep=1)
    _draws()  # move every stream on
    loaded = load_checkpoint(saved)
    tensors = [loaded["rng"][0]["torch"], loaded["rng"][0]["numpy"]["keys"]]
    assert all(t.device.type == "cpu" for t in tensors)
    restore_rng(loaded["rng"][0])
    assert _draws() == expected


def test_fp16_steps_the_grad_scaler_skips_are_reported_as_skipped():
    """trainer.precision=fp16 with on_nonfinite=skip: the GradScaler skips a non-finite step by itself; the loop
    must hear of it (skipped_steps, no NaN in the loss meter) instead of counting it as trained."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = Precision("fp16", torch.device("cpu"))  # a real GradScaler (torch's CPU one)
    assert precision.scaler is not None
    before = [p.detach().clone() for p in model.parameters()]

    precision.backward(model(torch.randn(8, 4)).sum() * float("nan"))
    assert precision.optimizer_step(model, optimizer, None, skip_nonfinite=True) is False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "a skipped step changes nothing"

    optimizer.zero_grad()
    precision.backward(model(torch.randn(8, 4)).pow(2).mean())
    assert precision.optimizer_step(model, optimizer, None, skip_nonfinite=True) is True
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_replica_autocast_keeps_the_runs_dtype_in_a_thread_with_another_default():
    """nn.DataParallel runs each replica in a new thread and enters autocast there without a dtype (CUDA's
    per-thread default is fp16). The wrapper enters the run's dtype inside the replica; shown here with CPU
    autocast, whose thread default (bf16) also differs from the dtype asked for (fp16)."""
    layer = nn.Linear(8, 8)
    # its own weights: autocast caches casts
    wrapped = Replica(nn.Linear(8, 8), torch.float16)
    dtypes = {}

    def replica_thread():
        with torch.autocast("cpu", enabled=True):  # what parallel_apply does: enabled, no dtype
            x = torch.randn(2, 8)
            dtypes["bare"], dtypes["wrapped"] = layer(x).dtype, wrapped(x).dtype

    thread = threading.Thread(target=replica_thread)
    thread.start()
    thread.join()
    assert dtypes == {"bare": torch.get_autocast_dtype("cpu"), "wrapped": torch.float16}
    assert dtypes["bare"] != torch.float16


class _OwnLoss(nn.Module):
    """A model that computes its own loss, the HuggingFace way: keyword arguments in, {loss (the batch's mean), logits}
    out."""

    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(16, 3)

    def forward(self, input_ids, labels):
        logits = self.embed(input_ids)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def _data_parallel_on_the_cpu(replica: nn.Module, replicas: int):
    """nn.DataParallel's forward without GPUs: the keyword arguments scattered into torch.chunk's pieces
    (comm.scatter), the replica run on each, and the outputs gathered per key (Gather.forward: 0-dim tensors
    unsqueezed, then concatenated); on one GPU the replica alone. Only this emulation is not torch's own code: its
    scatter and gather need CUDA."""
    def forward(**kwargs):
        if replicas == 1:
            return replica(**kwargs)
        shares = [dict(zip(kwargs, pieces)) for pieces in zip(*(v.chunk(replicas) for v in kwargs.values()))]
        outputs = [replica(**share) for share in shares]
        return {key: torch.cat([o[key].view(1) if o[key].dim() == 0 else o[key] for o in outputs])
                for key in outputs[0]}
    return forward


def test_dp_gives_a_models_own_loss_one_value_per_sample_whatever_the_gpus():
    """strategy=dp step=model_loss on 2+ GPUs: each replica's loss is its share's mean (0-dim), DataParallel's gather
    made a vector of one per GPU of them, and the step refused it at step 1 ("the loss returned shape [2] for a
    batch of 16"), in evaluation too. Each replica now gives its value to each of its samples: the batch's mean is
    one process's, each replica weighed by its share (11 samples over 2 GPUs: 6 and 5)."""
    from framework.strategies.dp import chunk_sizes
    from framework.training.step import ModelLoss

    torch.manual_seed(0)
    model = _OwnLoss()
    batch = {"input_ids": torch.randint(0, 16, (11, 5)), "labels": torch.randint(0, 3, (11,))}
    whole = model(**batch)["loss"]
    for gpus in (1, 2, 4):
        out = ModelLoss()(_data_parallel_on_the_cpu(Replica(model, None), gpus), batch, None)
        assert out.loss.shape == (11,) and out.samples == 11
        shares = chunk_sizes(11, gpus)
        assert out.loss.unique_consecutive(return_counts=True)[1].tolist() == shares
        assert float(out.loss.mean().detach()) == pytest.approx(float(whole.detach()), rel=1e-6), gpus
    out.loss.mean().backward()
    assert model.embed.weight.grad is not None, "the gradient reaches every replica's share"


@needs_gpus(2)
def test_dp_trains_a_model_with_its_own_loss_on_every_gpu():
    """The same on nn.DataParallel itself, over every GPU here."""
    from framework.training.step import ModelLoss

    strategy = strategy_for("strategy=dp", "trainer.accelerator=gpu")
    group = strategy.join()
    model = _OwnLoss().to(group.device)
    wrapped = strategy.parallelize(model, lambda params: torch.optim.SGD(params, lr=0.1), group)
    batch = {"input_ids": torch.randint(0, 16, (16, 5), device=group.device),
             "labels": torch.randint(0, 3, (16,), device=group.device)}
    out = ModelLoss()(wrapped.model, batch, None)
    assert out.loss.shape == (16,)
    out.loss.mean().backward()
    wrapped.optimizer.step()


def test_dp_slots_clock_and_meter_rows_agree_when_a_micro_batch_has_fewer_chunks_than_gpus():
    """Batch 10 on 8 GPUs: nn.DataParallel scatters 5 chunks of 2 and runs replicas on device_ids[:5] only. The
    clock (sized for the 8 device ids) is read for the 5 slots that ran, and the meter gives 5 rows (this crashed
    at the first log boundary: a wait of 8 values for 5 rows)."""
    from framework.strategies.dp import chunk_sizes
    from framework.telemetry.meter import MeterSources, StepRecord
    from framework.telemetry.meters import COLUMNS, IntervalMeter
    from framework.telemetry.replica_clock import _Marks

    assert chunk_sizes(10, 8) == [2, 2, 2, 2, 2] and chunk_sizes(30, 7) == [5] * 6 and chunk_sizes(4, 3) == [2, 2]
    assert chunk_sizes(256, 8) == [32] * 8 and chunk_sizes(10, 1) == [10]
    cpu = torch.device("cpu")
    clock = ReplicaClock([cpu] * 8)
    sizes = chunk_sizes(10, 8)
    meter = IntervalMeter(MeterSources(sizes, cpu, clock=clock))
    for step in range(1, 3):
        clock.begin_micro_batch()
        for slot in range(len(sizes)):  # what time_replicas() marks on each replica that ran
            marks = _Marks()
            marks.forward_start, marks.forward_end = 0.0, 1.0 + slot
            marks.backward_start, marks.backward_end = 5.0, 6.0
            clock.micro_batches[-1][slot] = marks
        meter.add(StepRecord(step, [torch.ones(10)]))
    rows = meter.rows()
    assert rows.shape == (5, len(COLUMNS))
    assert rows[:, COLUMNS.index("samples")].tolist() == [4.0] * 5
    # per micro-batch, replica s waits (slowest forward 5 s) - its own (1 + s) s; two micro-batches
    assert rows[:, COLUMNS.index("wait_seconds")].tolist() == pytest.approx([8.0, 6.0, 4.0, 2.0, 0.0])


def test_counting_flops_runs_the_model_without_its_prints_reaching_the_user(capsys):
    """The dp tutorial's model prints the size of every input it gets; FLOPs are counted with one forward on meta
    tensors, which printed "input size (30, 5)" before any training step (and broke the GPU test that reads them)."""
    from framework.models.linear import LinearModel
    from framework.telemetry.flops import training_flops_per_sample

    flops = training_flops_per_sample(LinearModel((5,), 2, print_sizes=True), (5,), 30)
    assert flops == 2 * (2 * 5 * 2)  # forward 2*5*2 FLOPs; backward the weight's gradient only (the input needs none)
    assert capsys.readouterr() == ("", "")


def test_fsdp_with_cpu_offload_creates_its_group_with_gloo_for_cpu_tensors_beside_nccl():
    """cpu_offload keeps sharded gradients in CPU memory, and clipping all-reduces them there: a bare "nccl" group
    fails at the first step with "No backend type associated with device type cpu"."""
    def backend(*overrides):
        return strategy_for("strategy=fsdp", *overrides).backend

    assert backend("trainer.accelerator=gpu", "strategy.cpu_offload=true") == "cpu:gloo,cuda:nccl"
    assert backend("trainer.accelerator=gpu", "strategy.cpu_offload=true", "strategy.backend=nccl") == "cpu:gloo,cuda:nccl"
    assert backend("trainer.accelerator=gpu") == "nccl"
    assert backend("trainer.accelerator=gpu", "strategy.cpu_offload=true", "strategy.backend=gloo") == "gloo"
    assert backend("trainer.accelerator=cpu") == "gloo"


def test_more_workers_than_gpus_under_torchrun_is_refused_with_the_counts(monkeypatch):
    """Each worker takes GPU local_rank modulo the GPUs it sees, so 4 torchrun workers on 2 GPUs put two nccl ranks
    on one GPU (nccl: "Duplicate GPU detected"). The device count is the one thing faked here: this machine has no
    GPU."""
    from framework.common.errors import ConfigError
    from framework.session.environment import TORCH, Ranks

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    four_on_this_node = Ranks(TORCH, rank=0, local_rank=0, world_size=4, local_world_size=4)
    with pytest.raises(ConfigError, match="with 4 workers on this node.*shows each of them 2 GPU"):
        strategy_for("strategy=ddp", "trainer.accelerator=gpu", ranks=four_on_this_node).validate()
    two_nodes_of_two = Ranks(TORCH, rank=0, local_rank=0, world_size=4, local_world_size=2)  # one GPU each
    strategy_for("strategy=ddp", "trainer.accelerator=gpu", ranks=two_nodes_of_two).validate()
    strategy_for("strategy=ddp", "trainer.accelerator=gpu", "strategy.backend=gloo", ranks=four_on_this_node).validate()


def test_a_mig_slice_gets_its_share_of_the_gpus_peak_or_no_mfu():
    from framework.telemetry.gpu_peaks import peak_tflops

    full = peak_tflops("NVIDIA H100 80GB HBM3", "bf16")
    assert peak_tflops("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "bf16", sm_count=60) == pytest.approx(full * 60 / 132)
    assert peak_tflops("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "bf16", sm_count=14) == pytest.approx(312 * 14 / 108)
    assert peak_tflops("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "bf16") is None  # SMs unknown: no MFU, not a wrong one
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16", sm_count=132) == full


@needs_gpus(2)
def test_dp_replicas_compute_in_bf16_and_the_first_device_id_is_current():
    from framework.strategies.dp import DataParallelStrategy

    if not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip(f"{torch.cuda.get_device_name()} has no bf16")

    strategy = strategy_for("strategy=dp", "strategy.device_ids=[1,0]", "trainer.precision=bf16",
                            "trainer.accelerator=gpu")
    assert isinstance(strategy, DataParallelStrategy)
    group = strategy.join()
    assert torch.cuda.current_device() == 1 and group.cuda_devices == [1, 0]
    layer = nn.Linear(16, 16).to(group.device)
    seen = []
    layer.register_forward_hook(lambda module, args, out: seen.append((out.device.index, out.dtype)))
    wrapped = strategy.parallelize(layer, lambda params: torch.optim.SGD(params, lr=0.1), group)
    with wrapped.precision.autocast():
        wrapped.model(torch.randn(8, 16, device=group.device))
    assert sorted(seen) == [(0, torch.bfloat16), (1, torch.bfloat16)]
    assert wrapped.module is layer


def test_one_gpu_per_slurm_task_is_accepted_by_the_driver(monkeypatch):
    """Two srun tasks on one node that each see one GPU: the driver must not count 2 workers against 1 visible GPU
    (it did when the scheduler's variables were missing: every GPU machine failed the GPU test below). Under plain
    torchrun, whose workers all see the node's GPUs, the same counts are refused."""
    from framework.common.errors import ConfigError
    from framework.session.detect import detect
    from framework.session.environment import _ranks

    launcher_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_")) and k not in launcher_vars}
    monkeypatch.setattr(os, "environ", {**env, **slurm_task(1, 2, "4242")})  # what adoption sets stays in this test
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # each task sees its one GPU
    task = detect().ranks  # what the command reads and hands the strategy
    assert task.scheduler == "slurm"
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"]) == ("1", "1", "2")
    strategy_for("strategy=ddp", "trainer.accelerator=gpu", ranks=task).validate()
    for name in [n for n in os.environ if n.startswith("SLURM_")]:  # the same ranks from torchrun: two workers
        del os.environ[name]  # share one GPU
    _ranks.cache_clear()  # a process reads its ranks once; this test plays another process
    with pytest.raises(ConfigError, match="with 2 workers on this node"):
        strategy_for("strategy=ddp", "trainer.accelerator=gpu", ranks=detect().ranks).validate()


def test_torchmetrics_states_go_through_an_object_gather_as_cpu_tensors_and_come_back_on_the_metrics_device():
    """Under Horovod (no torch.distributed group) a torchmetrics metric syncs through the group's object gather.
    Pickled CUDA tensors come back on the sender's GPU (cuda:1 on rank 0), and torch.stack of them failed: what is
    gathered must be on the CPU, what the sync returns on the metric's device ('meta' stands in for a GPU here)."""
    torchmetrics = pytest.importorskip("torchmetrics")
    from framework.training.metrics import sync_torchmetric

    metric, sent = torchmetrics.MeanSquaredError(), []

    def gather_objects(obj):
        sent.append(obj.device)
        return [obj, obj + 1]  # two ranks' states

    sync_torchmetric(metric, torch.device("meta"), 2, gather_objects)
    assert metric.distributed_available_fn()
    received = metric.dist_sync_fn(torch.ones(3))
    assert sent == [torch.device("cpu")]
    assert [t.device.type for t in received] == ["meta", "meta"]


def test_torchmetrics_sync_themselves_where_torch_distributed_is_the_backend(tmp_path):
    """ddp, fsdp, deepspeed (and eval.py under them): torchmetrics' own gather_all_tensors (tensor collectives on
    the metric's device), not an object gather."""
    torchmetrics = pytest.importorskip("torchmetrics")
    import torch.distributed as dist

    from framework.training.metrics import sync_torchmetric

    metric = torchmetrics.MeanSquaredError()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        sync_torchmetric(metric, torch.device("cpu"), 1, lambda obj: pytest.fail("object gather used"))
        assert metric.dist_sync_fn is None
        metric.update(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0]))
        assert float(metric.compute()) == pytest.approx(2.0)
    finally:
        dist.destroy_process_group()


def test_a_callbacks_all_reduce_of_a_cpu_tensor_travels_on_the_groups_device(tmp_path):
    """LoopState.all_reduce_sum handed a callback's CPU tensor straight to the process group, and nccl takes CUDA
    tensors only: it goes on the group's device now and comes back into the callback's tensor. A CPU cannot show
    nccl; the group here records the device it is given (meta, standing for cuda) and sums as two ranks would."""
    from framework.config.trainer import TrainerConfig
    from framework.training.checkpoint_io import CheckpointIO
    from framework.training.engine import LocalGroup, Wrapped
    from framework.training.loop_state import LoopState, RunInfo

    class TwoRanksOnAnotherDevice(LocalGroup):
        seen = []

        def all_reduce_sum(self, t):
            self.seen.append(t.device)
            return torch.full(tuple(t.shape), 2.0) * 3  # what two ranks' 3s sum to

    group = TwoRanksOnAnotherDevice(torch.device("meta"))
    model = nn.Linear(2, 2)
    wrapped = Wrapped(model, torch.optim.SGD(model.parameters(), lr=0.1), Precision("fp32", torch.device("cpu")),
                      CheckpointIO(0, 1, []), model)
    run = RunInfo(run_dir=tmp_path, say=print, hparams={}, model_record={}, stop=None, checkpointer=None,
                  callbacks=None)
    state = LoopState(TrainerConfig(), group, wrapped, run, 1, 1, higher_is_better=False)
    mine = torch.full((3,), 3.0)
    total = state.all_reduce_sum(mine)
    assert group.seen == [torch.device("meta")]
    assert total is mine and mine.tolist() == [6.0, 6.0, 6.0]


def test_a_mesh_on_gpus_refuses_gloo_and_never_suggests_it(monkeypatch):
    """gloo has no CUDA reduce-scatter, and its sends would get GPU pointers: a mesh on GPUs with strategy.backend=gloo
    is refused, and the refusals that count GPUs against workers no longer point there (on one GPU they did). The
    device count is the one thing faked here: this machine has no GPU."""
    from framework.common.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for name in ("SLURM_STEP_NUM_TASKS", "SUBMITIT_EXECUTOR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    def refusal(*overrides):
        with pytest.raises(ConfigError) as caught:
            strategy_for("strategy=tp", "trainer.accelerator=gpu", *overrides).validate()
        return str(caught.value)

    assert refusal("strategy.backend=gloo", "strategy.nproc_per_node=2").startswith(
        "strategy.backend=gloo is not allowed with strategy=tp on GPUs: the mesh's collectives")
    one_gpu = refusal()
    assert "strategy.tp=2 = 2 worker(s) is not allowed with 1 worker(s)" in one_gpu
    assert "a machine with 2 GPUs (this one has 1; the mesh takes one per worker)" in one_gpu and "gloo" not in one_gpu
    too_many = refusal("strategy.nproc_per_node=2")
    assert too_many.startswith("strategy.nproc_per_node=2 is not allowed with nccl") and "gloo" not in too_many
    # ddp may share a GPU over gloo, and still says so
    with pytest.raises(ConfigError, match="or strategy.backend=gloo"):
        strategy_for("strategy=ddp", "trainer.accelerator=gpu", "strategy.nproc_per_node=2").validate()
