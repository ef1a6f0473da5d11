"""One row of the plan: one strategy on one number of workers, per rank. The run is built as a worker builds it
(framework/assemble.py: build_task, parallelize) in a fake process group of the row's world size
(torch.distributed's "fake" backend: collectives that move nothing), its model built under FakeTensorMode and its
batch made fake (framework/plan/fake.py), and two training steps counted by LiveBytes (framework/plan/tracer.py).

ddp is traced as one process on its share of the batch (DistributedDataParallel cannot be built on fake tensors: it
copies them into real buckets), with DDP's gradient buckets added as DDP lays them out (framework/plan/buckets.py);
deepspeed likewise, with ZeRO's model state instead of the process's own (framework/plan/zero.py).
Tensor and pipeline parallel are traced on real tensors, in the fake process group all the same (on_real_tensors);
a pipeline's stages are given their shapes (framework/plan/pipeline.py), and each pipeline rank is traced."""
from __future__ import annotations

import dataclasses
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode

from framework.assemble import RunContext, build_task, parallelize, seed_everything
from framework.common.errors import ConfigError
from framework.config.settings import settings_of
from framework.config.targets import TargetAllowlist, allowing
from framework.plan.batch import planned_batch
from framework.plan.buckets import DDPBuckets
from framework.plan.pipeline import pipeline_ranks, pipeline_refusal, stage_shapes, static_stages
from framework.plan.steps import counted_steps
from framework.plan.tracer import LiveBytes
from framework.plan.zero import ZeroStates, zero_refusal
from framework.session.environment import TORCH, Ranks
from framework.strategies import choose_strategy
from framework.strategies.deepspeed_config import deepspeed_config
from framework.config.strategy_options import DeepSpeedOptions, MeshOptions, SingleOptions
from framework.strategies.single import SingleStrategy
from framework.training.engine import LocalGroup

PLANNED = ("single", "ddp", "fsdp", "tp", "pp", "deepspeed")  # the presets; a user's YAML of the same engines too
WHY_NOT = {
    "dp": "nn.DataParallel copies the model onto each GPU of one process at every step; not traced yet",
    "horovod": "Horovod's allreduce buffers live outside torch; not counted yet",
}


@dataclass(frozen=True, kw_only=True)
class Row:
    """Bytes per rank, at the peak of a training step (the second: the optimizer's state is alive), by what they
    hold; `buffers`: a strategy's own (ddp's gradient buckets); `peak` is their sum."""

    strategy: str
    workers: int
    micro_batch: int
    parameters: int
    gradients: int
    optimizer: int
    activations: int
    temporaries: int
    buffers: int
    batch: int
    peak: int
    seconds: float
    rank: int = 0  # whose bytes: rank 0's; a pipeline's, its rank with the largest peak


def _plannable(options) -> bool:
    """By the engine, not the name: a user's YAML naming the mesh (strategy=tp_plan) plans as its degrees say."""
    return isinstance(options, (SingleOptions, MeshOptions)) or _is_deepspeed(options)


def _is_deepspeed(options) -> bool:
    return isinstance(options, DeepSpeedOptions)


def check_plannable(cfg: DictConfig) -> None:
    """ConfigError, one line, for a config whose strategy cannot be planned yet, whose keys do not type, or that the
    strategy itself refuses as train.py would (a mesh whose degrees do not multiply to its workers)."""
    with allowing(TargetAllowlist.of_command(cfg)):
        strategy_class, _ = choose_strategy(cfg, None)
        s = settings_of(cfg, strategy_class.Options)
        name, plannable = s.strategy.name, _plannable(s.strategy)
        if plannable:
            strategy_class(s.strategy, s.trainer.engine(), ranks=None).validate()
    if _is_deepspeed(s.strategy) and (refusal := zero_refusal(s.strategy)):
        raise ConfigError(refusal)
    if getattr(s.strategy, "cpu_offload", False):
        raise ConfigError("strategy.cpu_offload=true cannot be planned yet: FSDP2 pins the shards it keeps in CPU "
                          "memory, which fake tensors cannot; plannable: strategy.cpu_offload=false")
    if (refusal := pipeline_refusal(s.strategy)) and plannable:
        raise ConfigError(refusal)
    if not plannable:
        raise ConfigError(f"strategy={name} cannot be planned yet: {WHY_NOT.get(name, 'not traced yet')}; "
                          f"plannable: {', '.join(PLANNED)}")
    if cfg.trainer.precision == "fp16":
        raise ConfigError("trainer.precision=fp16 cannot be planned yet: its GradScaler needs CUDA and the plan "
                          "traces on the CPU; plannable: fp32, bf16")


def micro_batch_multiple(cfg: DictConfig) -> int:
    """What a rank's micro-batch must be a multiple of: a pipeline's micro-batches (it cuts it in equal parts)."""
    with allowing(TargetAllowlist.of_command(cfg)):
        strategy_class, _ = choose_strategy(cfg, None)
        options = settings_of(cfg, strategy_class.Options).strategy
    return options.pipeline_microbatches if getattr(options, "pp", 1) > 1 else 1


def plan_row(cfg: DictConfig, workers: int | None = None, rank: int | None = None) -> Row:
    """The row for a composed config: its strategy on `workers` ranks, by default as many as it would start
    (strategy.nproc_per_node x nnodes; by default one per GPU of this machine), as `rank` holds it; by default rank
    0, and under pipeline parallel the pipeline rank with the largest peak."""
    check_plannable(cfg)
    started = time.perf_counter()
    with allowing(TargetAllowlist.of_command(cfg)):
        strategy_class, _ = choose_strategy(cfg, None)
        s = settings_of(cfg, strategy_class.Options)
        name = s.strategy.name
        if workers is None:
            workers = strategy_class(s.strategy, s.trainer.engine(), ranks=None).starter.processes()
        ranks = [rank] if rank is not None else \
            pipeline_ranks(s.strategy, workers) if getattr(s.strategy, "pp", 1) > 1 else [0]
        # a pipeline's ranks differ (the first holds the most micro-batches in flight under 1F1B, the last the
        # loss): each is traced, and the row is the one with the largest peak
        rank, (live, micro_batch, numels) = max(((r, _counted(s, strategy_class, workers, r)) for r in ranks),
                                                key=lambda counted: counted[1][0].peak)
    at_peak, peak = live.at_peak(), live.peak
    if _is_deepspeed(s.strategy):
        zero = ZeroStates.of(deepspeed_config(s.strategy, s.trainer, workers), workers, numels)
        at_peak, peak = zero.laid_over(at_peak, peak)
    return Row(strategy=name, workers=workers, rank=rank, micro_batch=micro_batch, peak=peak,
               seconds=time.perf_counter() - started, **at_peak)


def _counted(s, strategy_class, workers: int, rank: int = 0) -> tuple[LiveBytes, int, list[int]]:
    """`rank` of `workers`, built and stepped on fake tensors: its LiveBytes, its micro-batch and the sizes of the
    model's parameter tensors (each once; ZeRO-3 keeps the small ones whole)."""
    ddp = getattr(s.strategy, "runs_ddp", False)  # the mesh on its 1-D replicate mesh: DDP itself, whatever the name
    one_process = ddp or _is_deepspeed(s.strategy)  # on its share of the batch; their engines laid beside
    dist.init_process_group("fake", rank=rank, world_size=workers)
    try:
        engine = dataclasses.replace(s.trainer.engine(), cuda=False)  # traced on the CPU: the same bytes
        strategy = SingleStrategy(SingleOptions(), engine, None) if one_process else \
            strategy_class(s.strategy, engine, ranks=Ranks(TORCH, rank, rank, workers, workers))
        group = LocalGroup(torch.device("cpu")) if one_process else strategy.join()
        seed_everything(s.trainer.seed)
        mode = None if on_real_tensors(s.strategy) else FakeTensorMode()
        # the model made fake from the start (a model larger than this machine's memory plans all the same); the
        # memory layout changes no byte
        task = build_task(s, torch.device("cpu"), "planned on fake tensors", model_made_in=mode)
        numels = [p.numel() for p in task.model.parameters()]
        t = s.trainer
        micro_batch = t.batch_size // ((workers if one_process else group.dp_size) * t.grad_accum)
        batch = planned_batch(task.data, micro_batch, mode)
        pipelined = getattr(s.strategy, "pp", 1) > 1
        shapes = stage_shapes(task.model, s.strategy, batch, t.precision) if pipelined else None
        ctx = RunContext(settings=s, strategy=strategy, group=group, ranks=None, run_dir=None, say=_unsaid, stop=None)
        # outside the fake mode: a device mesh reads its ranks' values, which fake tensors have not
        wrapped = parallelize(ctx, task)
        if pipelined:
            static_stages(wrapped.runner, shapes)
        try:
            with mode or nullcontext(), LiveBytes() as live:
                if ddp:
                    DDPBuckets.of(s.strategy, wrapped.model).attach(live)
                counted_steps(wrapped, task.step, task.loss, batch, t, live)
        except (DataDependentOutputException, DynamicOutputShapeException) as exc:
            raise ConfigError(f"model={s.model.get('_target_')} cannot be planned: a training step reads a "
                              f"tensor's values ({exc.func}), which a fake tensor has not") from None
        return live, micro_batch, numels
    finally:
        dist.destroy_process_group()


def on_real_tensors(options) -> bool:
    """Tensor and pipeline parallel are traced on real tensors (still in the fake process group): the mesh engine
    moves the model with `model.to(device)` after tensor parallel and its pipeline cut, and torch refuses to swap a
    fake parameter the plan left plain (a replicated embedding, a stage's parameters). LiveBytes counts real and
    fake tensors alike (tests/unit/test_plan.py); the row costs the model's real memory and compute on the CPU."""
    return getattr(options, "tp", 1) > 1 or getattr(options, "pp", 1) > 1


def _unsaid(line: str) -> None:
    """What assembly would tell the run's console: nothing runs here."""
