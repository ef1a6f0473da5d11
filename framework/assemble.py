"""The one assembly: a run's task (data, model, step, loss, metrics) built from its settings, and what the loop
trains built from the task and the strategy. The driver's dry run (framework/preflight.py), every worker
(framework/worker.py) and eval.py (framework/evaluate.py) build their task here, the same way. With the driver, the
only code that reads the whole config; each component is built from, and receives, its own part.

A worker's run is assembled from one `RunContext`, built once after it joined (framework/worker.py,
framework/evaluate.py); what it hands the layers below is a slice (a DataShare, the trainer's options, a group)."""
from __future__ import annotations

import random
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, ContextManager

import numpy as np
import torch
from torch import nn

from framework.callbacks.base import Callback, Callbacks
from framework.callbacks.profiler import StepProfiler
from framework.checkpoints.state import signature
from framework.config.components import build_component
from framework.config.settings import Settings
from framework.data.augment import build_augment
from framework.data.batches import tree_map
from framework.data.build import Data, build_data
from framework.data.loaders import BatchPipeline, build_train_loader, eval_batches, prepare
from framework.data.ranks_in_turn import RanksInTurn
from framework.data.source import DataShare, Peers
from framework.data.streams import is_stream
from framework.data.text import vocabulary_of
from framework.common.errors import ConfigError
from framework.models.build import build_model
from framework.session.environment import Ranks
from framework.strategies.base import Strategy
from framework.telemetry.meter import MeterSources
from framework.telemetry.meter_registry import METERS
from framework.telemetry.meters import IntervalMeter
from framework.telemetry.per_gpu import count_flops, has_convolutions
from framework.telemetry.stall import Heartbeat
from framework.training.checkpointing import Checkpointer
from framework.training.determinism import apply_determinism
from framework.training.engine import ProcessGroup, Wrapped, slot_sizes
from framework.training.instrument import gradient_traffic, per_gpu, timed_barrier, wait_clock
from framework.training.invariant import FixedPointSum, GatheredTreeSum, InvariantStep
from framework.training.loop_state import RunInfo
from framework.training.metrics import build_loss, build_metrics, check_metrics, class_ids_of
from framework.training.optim import build_optimizer
from framework.training.param_groups import ParamGroups
from framework.training.speedups import apply_speedups, use_channels_last
from framework.training.trainer import LoopData, LoopTelemetry, Trainer

EVAL_BATCH_PER_DEVICE = 1024


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """One process's run as assembly takes it, built once after the process joined its group: the typed settings,
    the strategy and the group it joined, the ranks its starter gave it (None: nobody started it as one of several),
    the run folder (an evaluation's own folder for eval.py), where its lines go and what stops its loop."""

    settings: Settings
    strategy: Strategy
    group: ProcessGroup
    ranks: Ranks | None
    run_dir: Path
    say: Callable[[str], None]  # rank 0's console and train.log (framework/telemetry/progress.py: Console)
    stop: object  # framework/training/interrupts.py: .requested, .signum


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass(kw_only=True)
class Task:
    """What a run trains or evaluates: the data, the plain model (on the CPU, before any wrapper), the step, the loss
    and the metrics, the batched augmentation, and the memory layout the model and batches share on `device`."""

    data: Data
    model: nn.Module
    step: object
    loss: object
    metrics: dict
    augment: object
    channels_last: bool


def build_task(s: Settings, device: torch.device, channels_last_refusal: str | None, check: bool = False,
               model_made_in: ContextManager | None = None) -> Task:
    """Every component from its own options. check=True (the driver, once): the datasets' files, sample shapes and
    class ids are checked too (framework/data/build.py). model_made_in: a context the model is built in (the
    planner's FakeTensorMode, framework/plan/rows.py: its weights take no memory)."""
    loss = build_loss(s.loss)
    metrics = build_metrics(s.metrics)
    # class ids are checked where the loss or a metric takes them
    step = build_component(s.step, "step")
    needs_targets = s.step["_target_"] if getattr(step, "needs_targets", False) else None
    data = build_data(s.dataset, class_ids_of(loss, metrics), check=check, needs_targets=needs_targets)
    check_metrics(metrics, data.num_classes)
    with model_made_in or nullcontext():
        model = build_model(s.model, data.in_shape, data.num_classes)
    augment = build_augment(s.dataset.augment, data.in_shape)
    # resolved once: the model's layout and the batches' layout must agree
    channels_last = use_channels_last(s.trainer.channels_last, model, device, data.in_shape,
                                      channels_last_refusal is None)
    return Task(data=data, model=model, step=step, loss=loss, metrics=metrics, augment=augment,
                channels_last=channels_last)


def assemble_task(ctx: RunContext) -> Task:
    """The run's task in a worker, every rank seeded alike first (the same initial weights everywhere), in torch's
    deterministic mode where trainer.deterministic asks for it."""
    apply_determinism(ctx.settings.trainer.deterministic)
    seed_everything(ctx.settings.trainer.seed)
    return build_task(ctx.settings, ctx.group.device, ctx.strategy.channels_last_refusal)


def assemble_run(ctx: RunContext, callbacks: Callbacks) -> Trainer:
    """What a worker trains: its task parallelized by the strategy, the loop's telemetry, data and checkpoints, in
    one Trainer (its wrapped model closed here where assembly fails after parallelize)."""
    t, group = ctx.settings.trainer, ctx.group
    if t.invariant:  # a kernel's sums can depend on its thread count (docs/invariant.md)
        torch.set_num_threads(t.invariant_threads)
    task = assemble_task(ctx)
    micro_batch = t.batch_size // (group.dp_size * t.grad_accum)
    # before any wrapper: FLOPs are counted on the plain module (ZeRO-3 would partition its weights in place)
    flops = count_flops(task.model, example_input(task.data), micro_batch) if group.is_main else None
    wrapped = parallelize(ctx, task)
    try:
        telemetry = loop_telemetry(ctx, wrapped, task, micro_batch, flops)
        data = loop_data(ctx, task, train_source(ctx, task, micro_batch), micro_batch)
        data.invariant = invariant_step(ctx, task)
        checkpointer = Checkpointer(group, ctx.run_dir, t, run_signature(ctx.settings, task.data), ctx.say,
                                    timed_barrier(group, telemetry.clock))
        run = RunInfo(run_dir=ctx.run_dir, say=ctx.say, hparams=hparams_of(ctx.settings, ctx.strategy.name),
                      model_record=model_record(ctx.settings.model, task.data), stop=ctx.stop,
                      checkpointer=checkpointer, callbacks=callbacks)
        return Trainer(t, ctx.settings.lr_schedule, group=group, wrapped=wrapped, data=data, telemetry=telemetry,
                       run=run)
    except BaseException:
        wrapped.close()
        raise


def loop_data(ctx: RunContext, task: Task, source=None, micro_batch: int = 0) -> LoopData:
    """What the loop trains on (`source`, none for eval.py) and evaluates on, and how it scores them."""
    return LoopData(source, micro_batch, test_batches(ctx, task), task.step, task.loss, task.metrics)


def train_source(ctx: RunContext, task: Task, micro_batch: int):
    """This process's training steps: its data-parallel rank's; with trainer.deal_as_ranks=N those of N ranks in
    turn (framework/data/ranks_in_turn.py; a stream one process reads is dealt so already)."""
    s, group, say = ctx.settings, ctx.group, ctx.say
    t, data = s.trainer, task.data
    augment = None if t.invariant else task.augment  # the mode augments each micro-shard (invariant_step)
    pipeline = BatchPipeline(data.normalization, data.in_shape, group.device, task.channels_last, augment)
    share = data_share(group, micro_batch, t.grad_accum, t.num_workers)
    n = t.deal_as_ranks
    if n and not is_stream(data.train):
        played = [replace(share, rank=rank, world=n, grad_accum=t.grad_accum // n) for rank in range(n)]
        return RanksInTurn([build_train_loader(data, each, pipeline, s.dataset.in_memory, t.seed,
                                               say if each.rank == 0 else _unsaid) for each in played], share)
    return build_train_loader(data, share, pipeline, s.dataset.in_memory, t.seed, say)


def invariant_step(ctx: RunContext, task: Task) -> InvariantStep | None:
    """trainer.invariant: each step's micro-batch run as this rank's micro-shards, augmented each by where it is,
    their gradients summed exactly (framework/training/invariant/step.py); None otherwise."""
    t, group = ctx.settings.trainer, ctx.group
    if not t.invariant:
        return None
    reducer = {"fixed_point": FixedPointSum, "gathered": GatheredTreeSum}[t.invariant_reduce](t.micro_shards)
    # the loader normalized the micro-batch; each shard is copied out of it (the same memory layout whatever the
    # stride it was cut with), augmented, and laid out as the model wants
    pipeline = BatchPipeline(None, task.data.in_shape, group.device, task.channels_last, task.augment)

    def prepare_shard(shard, generator):
        return prepare(tree_map(torch.Tensor.contiguous, shard), pipeline, task.data.pairs, generator)

    ctx.say(f"invariant mode: {t.micro_shards} micro-shards of {t.batch_size // t.micro_shards} samples a step "
            f"({t.micro_shards // group.dp_size} per rank), {torch.get_num_threads()} CPU thread(s) per process, "
            f"gradients summed by {t.invariant_reduce}: the same bits on any number of workers dividing "
            f"{t.micro_shards}")
    return InvariantStep(t.micro_shards, reducer, group, t.seed, prepare_shard)


def _unsaid(line: str) -> None:
    """The other played ranks' notes (trainer.deal_as_ranks): the first one's, said once."""


def loop_telemetry(ctx: RunContext, wrapped: Wrapped, task: Task, micro_batch: int, flops) -> LoopTelemetry:
    """The loop's meters for what parallelize() made: its wait clock, per-slot meters, per-GPU facts, heartbeat."""
    s, group = ctx.settings, ctx.group
    clock = wait_clock(wrapped, group)
    sources = MeterSources(slot_sizes(wrapped, micro_batch), group.device, share=group.dp_size / group.world_size,
                           clock=clock, traffic=gradient_traffic(wrapped),
                           cuda_devices=tuple(torch.device("cuda", i) for i in group.cuda_devices),
                           optimizer=wrapped.optimizer)
    meter = IntervalMeter(sources, METERS + (InvariantStep.meters if s.trainer.invariant else ()))
    devices = per_gpu(group, wrapped, micro_batch, flops, s.trainer, has_convolutions(task.model), ctx.say)
    return LoopTelemetry(meter, devices, Heartbeat(ctx.group.device), clock)


def parallelize(ctx: RunContext, task: Task) -> Wrapped:
    """The task's model with its speed-ups, on the device and in the engine's wrapper, with its optimizer (its
    param groups planned on the plain model, by the user's parameter names)."""
    s, strategy, group = ctx.settings, ctx.strategy, ctx.group
    groups = ParamGroups.of(s.optimizer, task.model)
    t, modules = s.trainer, strategy.speedup_modules(task.model)
    model = apply_speedups(task.model, task.channels_last, group.device, move=not strategy.moves_model_itself,
                           checkpointed=modules.recomputed if t.activation_checkpointing else (),
                           compiled=modules.compiled if t.compile else (), backend=t.compile_backend)
    workers = group.dp_size * len(group.devices)  # data-parallel processes x the GPUs each drives (dp's replicas)
    return strategy.parallelize(
        model, lambda params, names=None: build_optimizer(s.optimizer, params, workers, groups, names), group)


def data_share(group: ProcessGroup, micro_batch: int, grad_accum: int = 1, num_workers: int = 0) -> DataShare:
    """This rank's place in the data: its data-parallel rank (model-parallel peers share one), the samples it takes
    at a time and its peers' collectives."""
    return DataShare(group.dp_rank, group.dp_size, group.device, micro_batch, grad_accum, num_workers,
                     peers=Peers(group.dp_all_reduce_sum, group.gather_objects))


def test_batches(ctx: RunContext, task: Task):
    """A function giving this rank's share of the test split, in batches on its device (never augmented)."""
    group = ctx.group
    pipeline = BatchPipeline(task.data.normalization, task.data.in_shape, group.device, task.channels_last)
    share = data_share(group, EVAL_BATCH_PER_DEVICE, num_workers=ctx.settings.trainer.num_workers)
    return lambda: eval_batches(task.data.test, share, pipeline, task.data.collate["test"], task.data.pairs,
                                task.data.example)


def example_input(data: Data) -> object:
    """The first training sample's input as the model gets it (normalized where the dataset says how): what FLOPs
    are counted on."""
    return BatchPipeline(data.normalization, data.in_shape, torch.device("cpu"))(data.inputs(data.example))


def build_callbacks(nodes: dict, profile: list[int] | None = None) -> dict[str, Callback]:
    """The callbacks group's components by name, in order; trainer.profile adds the step profiler first."""
    callbacks: dict[str, Callback] = {"profiler": StepProfiler(*profile)} if profile else {}
    for name, node in (nodes or {}).items():
        callback = build_component(node, f"callbacks.{name}")
        if not isinstance(callback, Callback):
            raise ConfigError(f"callbacks.{name}._target_={node['_target_']} is not allowed: it built a "
                              f"{type(callback).__name__}, not a framework.callbacks.base.Callback")
        callbacks[str(name)] = callback
    return callbacks


def model_record(model_config: dict, data: Data) -> dict:
    """What rebuilds the model outside a run (framework/results/trained_model.py), and the vocabulary its token ids
    stand for where the dataset has one (sample.py)."""
    return {"model_config": model_config, "in_shape": data.in_shape, "num_classes": data.num_classes,
            "vocab": vocabulary_of(data.train)}


def run_signature(s: Settings, data: Data) -> dict:
    """What a checkpoint of this run must match to be resumed by another (framework/checkpoints/state.py)."""
    scheduler = s.lr_schedule.scheduler if s.lr_schedule.name == "torch" else None
    return signature(s.model, s.dataset.display_name, s.optimizer._target_, data.in_shape, data.num_classes,
                     param_groups=s.optimizer.param_groups, lr_scheduler=scheduler)


def hparams_of(s: Settings, strategy_name: str) -> dict:
    t = s.trainer
    return {
        "strategy": strategy_name, "model": s.model_name, "dataset": s.dataset.display_name,
        "optimizer": s.optimizer._target_.rsplit(".", 1)[-1], "lr": float(s.optimizer.lr),
        "global_batch": t.batch_size, "grad_accum": t.grad_accum, "precision": t.precision, "seed": t.seed,
    }
