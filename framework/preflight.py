"""Every check that can fail before a worker starts, on the typed settings: what each group's own schema cannot know
(the machine, the strategy, the dataset's real files and samples, the model against the data, the checkpoint a run
would resume). Messages name the key, the value and what is allowed."""
from __future__ import annotations

from pathlib import Path

import torch

from framework.assemble import Task, build_task, example_input, run_signature
from framework.checkpoints.disk import checkpoint_bytes, space_warning
from framework.checkpoints.manager import choose_checkpoint
from framework.checkpoints.position import Position, PositionDoesNotFit, resume_point
from framework.checkpoints.state import signature_mismatch
from framework.checkpoints.store import CHECKPOINT_DIR, Checkpoint, list_checkpoints
from framework.config.invariant import check_invariant
from framework.config.settings import Settings
from framework.data.batches import describe
from framework.data.build import Data, is_class_ids
from framework.data.loaders import first_batch
from framework.common.errors import ConfigError, first_line
from framework.data.streams import shards_itself, split_length
from framework.strategies.base import Strategy
from framework.strategies.muon_engines import muon_refusal
from framework.telemetry.flops import silenced
from framework.training.async_save import async_refusal
from framework.training.determinism import environment_refusal
from framework.training.invariant.batch_norm import refuse_running_statistics
from framework.training.lr_schedule import build_lr_schedule
from framework.training.metrics import higher_is_better, is_torchmetric, per_sample_losses
from framework.training.optim import build_optimizer
from framework.training.param_groups import ParamGroups
from framework.training.step import ModelLoss, Supervised
from framework.training.trainer import planned_steps


def validate(s: Settings, strategy: Strategy, run_dir: Path) -> Checkpoint | None:
    """Raises ConfigError on the first problem; returns the checkpoint the run will resume from (verified once,
    here), or None."""
    if s.trainer.accelerator == "gpu" and not torch.cuda.is_available():
        raise ConfigError("trainer.accelerator=gpu is not allowed here: no CUDA GPU is visible; use auto or cpu")
    strategy.validate()
    async_refusal(s.trainer.async_checkpoint, strategy.checkpoint_format.name, strategy.name)
    _machine(s, strategy)
    # builds both splits once (finding, or downloading, their files); class ids are checked where they are taken
    task = build_task(s, torch.device("cpu"), strategy.channels_last_refusal, check=True)
    strategy.check_model(task.model)
    _blocks(s, strategy, task.model)
    _objective(s, task.metrics)
    muon_refusal(s.optimizer, strategy)
    _optimizer_and_schedule(s, task)
    _batch_split(s, strategy, split_length(task.data.train))
    _dealt_as_ranks(s, strategy, task.data.train)
    _invariant(s, strategy, task)
    _schedule_length(s, task.data.train)
    dry_run(s, task)
    strategy.check_task(task.model, example_input(task.data), task.data.train)
    checkpoint = _resume(s, strategy, run_dir, task.data)
    _checkpoint_room(s, run_dir, task.model)
    return checkpoint


def _machine(s: Settings, strategy: Strategy) -> None:
    t = s.trainer
    if t.channels_last is True and strategy.channels_last_refusal:
        raise ConfigError(f"trainer.channels_last=true is not allowed with strategy={strategy.name}: "
                          f"{strategy.channels_last_refusal}; use auto or false")
    if t.precision == "fp16" and not strategy.trainer.cuda:
        raise ConfigError("trainer.precision=fp16 is not allowed on the CPU (it needs CUDA's GradScaler); use bf16 or fp32")
    if refusal := environment_refusal(t.deterministic):
        raise ConfigError(refusal)
    # bf16 the GPU computes itself: torch's default also counts what an older GPU only emulates, slowly
    cuda = strategy.trainer.cuda
    if t.precision == "bf16" and cuda and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise ConfigError(f"trainer.precision=bf16 is not allowed on {torch.cuda.get_device_name()}: it has no bf16 "
                          "support; use fp16 or fp32")


def _invariant(s: Settings, strategy: Strategy, task: Task) -> None:
    """trainer.invariant=true: what the world-size-invariant mode cannot make equal on every world size."""
    if not s.trainer.invariant:
        return
    check_invariant(s.trainer, strategy.options, strategy.batch_shares(), strategy.trainer.cuda)
    refuse_running_statistics(task.model, s.model_name)
    if split_length(task.data.train) is None:
        raise ConfigError("trainer.invariant=true is not allowed with a dataset.train that is a stream (an "
                          "IterableDataset): its ranks agree on each step's samples, which change with their number; "
                          "use a map-style dataset, or leave trainer.invariant out")


def _blocks(s: Settings, strategy: Strategy, model) -> None:
    if s.trainer.activation_checkpointing and not strategy.speedup_modules(model).recomputed:
        raise ConfigError(f"trainer.activation_checkpointing=true is not allowed for {type(model).__name__}: it has "
                          "no blocks to recompute one at a time (submodules holding parameters); use "
                          "trainer.activation_checkpointing=false")


def _optimizer_and_schedule(s: Settings, task: Task) -> None:
    """The optimizer on its param groups, and the lr scheduler on it, built once: a pattern that matches no parameter,
    what a constructor refuses, each is one line naming the key."""
    optimizer = build_optimizer(s.optimizer, task.model.parameters(), 1, ParamGroups.of(s.optimizer, task.model))
    if s.lr_schedule.name == "torch":
        t = s.trainer
        steps, _ = planned_steps(_steps_per_epoch(s, task.data.train), t.epochs, t.max_steps)
        objective_higher = t.objective != "loss" and higher_is_better(task.metrics[t.objective])
        build_lr_schedule(s.lr_schedule, optimizer, steps, objective_higher)


def _checkpoint_room(s: Settings, run_dir: Path, model) -> None:
    """A warning (not an error: the run may stop early, or the disk get room) when the run folder cannot hold
    trainer.keep_checkpoints + 1 checkpoints of this model and optimizer."""
    if s.trainer.keep_checkpoints == 0:
        return
    folder = run_dir / CHECKPOINT_DIR
    groups = ParamGroups.of(s.optimizer, model)
    each = checkpoint_bytes(model, lambda params: build_optimizer(s.optimizer, params, 1, groups))
    warning = space_warning(folder, s.trainer.keep_checkpoints, len(list_checkpoints(folder)), each)
    if warning:
        print(warning, flush=True)


def dry_run(s: Settings, task: Task) -> None:
    """Two real training samples through the model, the loss and the metrics, on the CPU, before any worker starts:
    a model that cannot take the dataset's input, a loss that cannot score its outputs, a metric that does not fit
    the task, each is one line naming it, the batch's shapes and dtypes, and the error."""
    data, model, step, loss, metrics = task.data, task.model, task.step, task.loss, task.metrics
    batch = first_batch(data, 2)
    shapes = (f"{describe(batch[0], 'input')}; {describe(batch[1], 'target')}" if data.pairs
              else describe(batch, "batch"))
    model_name = f"model={s.model.get('_target_')}"
    model.train()
    with torch.no_grad(), silenced():
        if isinstance(step, Supervised):  # say which of the two failed: the model, or the loss on its outputs
            _one_line(lambda: model(batch[0]), f"{model_name} cannot take the dataset's batches ({shapes})")
        failed = (f"step=model_loss: {model_name} cannot take the dataset's batches as keyword arguments ({shapes})"
                  if isinstance(step, ModelLoss) else f"loss={s.loss.get('_target_')} cannot score {model_name}'s "
                  f"outputs on the dataset's targets ({shapes})")
        out = _one_line(lambda: step(model, batch, loss), failed)
        _one_line(lambda: per_sample_losses(out.loss, out.samples), f"loss={s.loss.get('_target_')}")
        for name, metric in metrics.items():
            if getattr(metric, "expects_class_ids", False) and not is_class_ids(out.targets):
                raise ConfigError(f"metrics.{name}={s.metrics[name].get('_target_')} is not allowed for these targets "
                                  f"({describe(out.targets, 'target')}): it scores class ids; name the metrics of "
                                  "this task (e.g. metrics=regression, a torchmetrics metric by _target_, or "
                                  "metrics={})")

            def score():
                if is_torchmetric(metric):
                    metric.update(out.outputs, out.targets)
                    metric.reset()
                else:
                    metric(out.outputs, out.targets)
            _one_line(score, f"metrics.{name}={s.metrics[name].get('_target_')} cannot score the model's outputs "
                             f"on the dataset's targets ({describe(out.outputs, 'outputs')}; {shapes})")


def _one_line(call, what: str):
    try:
        return call()
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{what}: {type(exc).__name__}: {first_line(exc)}") from None


def _objective(s: Settings, metrics: dict) -> None:
    objective = s.trainer.objective
    if objective != "loss" and objective not in metrics:
        raise ConfigError(f"trainer.objective={objective!r} is not allowed: expected loss or a metric of this run "
                          f"({', '.join(metrics) or 'none'})")


def _resume(s: Settings, strategy: Strategy, run_dir: Path, data: Data) -> Checkpoint | None:
    """The checkpoint a run would resume from must exist, belong to this model, dataset and optimizer, and be
    in the format this strategy reads (one file, or a sharding engine's folder)."""
    resume = s.trainer.resume
    checkpoint = choose_checkpoint(resume, run_dir, warn=lambda m: print(f"warning: {m}", flush=True))
    if checkpoint is None:
        return None
    ours = run_signature(s, data)
    mismatch = signature_mismatch(checkpoint.manifest.get("signature", {}), ours)
    if mismatch:
        raise ConfigError(f"trainer.resume={resume} is not allowed: checkpoint {checkpoint.path} comes from a "
                          f"different setup ({mismatch}); use trainer.resume=none or a matching checkpoint")
    saved = checkpoint.manifest.get("format", "file")
    readable = strategy.checkpoint_format.readable
    if saved not in readable:
        raise ConfigError(f"trainer.resume={resume} is not allowed: checkpoint {checkpoint.path} has format {saved}, "
                          f"and strategy={strategy.name} reads {' or '.join(readable)}; use the strategy (and "
                          "strategy.zero_stage) that wrote it, or trainer.resume=none")
    check_world_size(f"trainer.resume={resume}", checkpoint.path, checkpoint.manifest, strategy,
                     "start over with trainer.resume=none (DeepSpeed's zero_to_fp32.py turns the shards into one fp32 "
                     "state_dict of the weights, for use outside a resumed run)")
    _resume_stream(s, strategy, checkpoint, data.train)
    _resume_position(s, checkpoint, _steps_per_epoch(s, data.train))
    return checkpoint


def _resume_stream(s: Settings, strategy: Strategy, checkpoint: Checkpoint, train) -> None:
    """A stream the framework shards continues on any world size (framework/data/streams.py); one that shards
    itself keeps a position per rank, which another world size cannot split anew."""
    saved, now = checkpoint.manifest.get("world_size"), strategy.starter.processes()
    if shards_itself(train) and saved not in (None, now):
        raise ConfigError(f"trainer.resume={s.trainer.resume} is not allowed with {now} worker(s): checkpoint "
                          f"{checkpoint.path} stopped mid-stream on {saved} workers, and dataset.train "
                          f"({type(train).__name__}) shards itself, so its position is per rank and cannot be split "
                          f"anew; use {saved} workers, or trainer.resume=none")


def _schedule_length(s: Settings, train) -> None:
    """A stream's length is unknown: a schedule over the run's steps needs trainer.max_steps."""
    # (lr_schedule=torch: the scheduler says itself what it needs, when it is built: _optimizer_and_schedule)
    if split_length(train) is None and not s.trainer.max_steps and s.lr_schedule.name not in ("constant", "torch"):
        raise ConfigError(f"lr_schedule={s.lr_schedule.name} is not allowed without trainer.max_steps: dataset.train "
                          "is a stream (an IterableDataset) of unknown length, so the schedule has no total number of "
                          "steps; set trainer.max_steps, or use lr_schedule=constant")


def check_world_size(what: str, path: Path, manifest: dict, strategy: Strategy, otherwise: str) -> None:
    """A checkpoint holds global state (one file; or shards an engine can reshard) unless the strategy says its
    engine's shards only load into the world size that wrote them (DeepSpeed ZeRO): then it is refused here, in the
    driver, for a resumed run and for eval.py alike (DeepSpeed itself would raise in every worker)."""
    saved = manifest.get("world_size")
    if saved is None or saved == strategy.starter.processes() or strategy.checkpoint_format.reshards:
        return
    raise ConfigError(
        f"{what} is not allowed with {strategy.starter.processes()} worker(s): checkpoint {path} holds "
        f"{manifest.get('format')} shards of {saved} workers, and strategy={strategy.name} cannot reshard them onto "
        f"another world size. Use {saved} workers (e.g. strategy.nproc_per_node={saved} on one node), or {otherwise}")


def _steps_per_epoch(s: Settings, train) -> int | None:
    """The training split's global batches per epoch (at least one: a larger batch is refused apart); None for a
    stream, whose length is unknown."""
    samples = split_length(train)
    return None if samples is None else max(samples // s.trainer.batch_size, 1)


def _resume_position(s: Settings, checkpoint: Checkpoint, steps_per_epoch: int | None) -> None:
    """The saved data position must be a whole number of this run's global batches (position.py says why; a
    stream's position is what its steps had, whatever the batch)."""
    if steps_per_epoch is None:
        return
    batch = s.trainer.batch_size
    missing = sorted({"step", "epoch", "samples_in_epoch", "batch_size"} - set(checkpoint.manifest))
    if missing:
        raise ConfigError(f"trainer.resume={s.trainer.resume} is not allowed: checkpoint {checkpoint.path} does not "
                          f"record {', '.join(missing)} (an earlier hydra-dist wrote it); start over with "
                          "trainer.resume=none")
    position = Position.from_saved(checkpoint.manifest)
    try:
        resume_point(position, batch, steps_per_epoch)
    except PositionDoesNotFit as exc:
        raise ConfigError(f"trainer.batch_size={batch} is not allowed when resuming from {checkpoint.path}: "
                          f"{exc}") from None


def _dealt_as_ranks(s: Settings, strategy: Strategy, train) -> None:
    """trainer.deal_as_ranks=N: one process plays N ranks' data (framework/data/ranks_in_turn.py)."""
    t, shares = s.trainer, strategy.batch_shares()
    n = t.deal_as_ranks
    if n is None:
        return
    if shares > 1:
        raise ConfigError(f"trainer.deal_as_ranks={n} is not allowed with strategy={strategy.name} ({shares} "
                          "data-parallel ranks): it makes one process read the data as N ranks would; use it with "
                          "one process (strategy=single), or leave it out")
    if t.grad_accum % n:
        raise ConfigError(f"trainer.deal_as_ranks={n} is not allowed with trainer.grad_accum={t.grad_accum}: a step "
                          f"takes a micro-batch of every rank in turn, so trainer.grad_accum must be a multiple of {n} "
                          f"({n} x the accumulation of each rank)")
    if shards_itself(train):
        raise ConfigError(f"trainer.deal_as_ranks={n} is not allowed with a dataset.train that shards itself over "
                          "ranks (shards_itself, or a HuggingFace IterableDataset): it reads the rank of the process "
                          "that reads it; use a map-style dataset or a stream the framework shards, or leave it out")


def _batch_split(s: Settings, strategy: Strategy, samples: int | None) -> None:
    t = s.trainer
    shares, processes = strategy.batch_shares(), strategy.starter.processes()
    if t.batch_size % (shares * t.grad_accum):
        over = f"{shares} process(es)" if shares == processes else (
            f"{shares} data-parallel rank(s) (of {processes} processes)")
        raise ConfigError(
            f"trainer.batch_size={t.batch_size} is not allowed with {over} x trainer.grad_accum={t.grad_accum}: "
            f"the global batch must divide evenly; use a multiple of {shares * t.grad_accum}"
        )
    if samples is not None and t.batch_size > samples:
        raise ConfigError(
            f"trainer.batch_size={t.batch_size} is not allowed: the training split has only {samples} samples "
            "(dataset.max_train_samples / dataset.train_size); use a batch of at most that"
        )
