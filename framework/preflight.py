"""Every check that can fail before a worker starts. Messages name the key, the value and what is allowed."""
from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from framework.checkpoints.disk import checkpoint_bytes, space_warning
from framework.checkpoints.manager import choose_checkpoint
from framework.checkpoints.position import Position, PositionDoesNotFit, resume_point
from framework.checkpoints.state import signature, signature_mismatch
from framework.checkpoints.store import CHECKPOINT_DIR, Checkpoint, list_checkpoints
from framework.config.checks import (boolean, fail, int_at_least, int_list, number_above, number_in, one_of,
                                     positive_number, value_at)
from framework.data.augment import build_augment
from framework.data.build import Data, build_data
from framework.errors import ConfigError
from framework.training.lr_schedule import SCHEDULES
from framework.training.metrics import build_loss, build_metrics
from framework.models.build import check_model_fits
from framework.training.optim import build_optimizer
from framework.training.precision import PRECISIONS
from framework.strategies import Strategy


def validate(cfg: DictConfig, strategy: Strategy, run_dir: Path) -> None:
    _trainer(cfg)
    _optimizer(cfg)
    _lr_schedule(cfg)
    strategy.validate()
    _channels_last_with(cfg, strategy)
    _precision_on_device(cfg, strategy)
    data = _dataset(cfg)  # builds both splits once (finding, or downloading, their files) and checks them
    model = check_model_fits(cfg.model, data.in_shape, data.num_classes)
    strategy.check_model(model)
    build_augment(cfg.dataset, data.in_shape)
    _loss_and_metrics(cfg, data)
    _batch_split(cfg, strategy, len(data.train))
    _resume(cfg, strategy, run_dir, data)
    _checkpoint_room(cfg, run_dir, model)


def _checkpoint_room(cfg: DictConfig, run_dir: Path, model) -> None:
    """A warning (not an error: the run may stop early, or the disk get room) when the run folder cannot hold
    trainer.keep_checkpoints + 1 checkpoints of this model and optimizer."""
    folder = run_dir / CHECKPOINT_DIR
    each = checkpoint_bytes(model, lambda params: build_optimizer(cfg, params, 1))
    warning = space_warning(folder, cfg.trainer.keep_checkpoints, len(list_checkpoints(folder)), each)
    if warning:
        print(warning, flush=True)


def _loss_and_metrics(cfg: DictConfig, data: Data) -> None:
    build_loss(cfg)
    metrics = build_metrics(cfg, data.num_classes)
    objective = value_at(cfg, "trainer.objective")
    if objective != "loss" and objective not in metrics:
        fail("trainer.objective", objective, f"expected loss or a metric of this run ({', '.join(metrics) or 'none'})")


def _resume(cfg: DictConfig, strategy: Strategy, run_dir: Path, data: Data) -> None:
    """The checkpoint a run would resume from must exist, belong to this model, dataset and optimizer, and be
    in the format this strategy reads (one file, or a sharding engine's folder)."""
    resume = cfg.trainer.resume
    if resume is not None and not isinstance(resume, str):
        fail("trainer.resume", resume, "expected auto, none, or a path to a checkpoint or run folder")
    checkpoint = choose_checkpoint(resume, run_dir, warn=lambda m: print(f"warning: {m}", flush=True))
    if checkpoint is None:
        return
    mismatch = signature_mismatch(checkpoint.manifest.get("signature", {}), signature(cfg, data.in_shape, data.num_classes))
    if mismatch:
        raise ConfigError(f"trainer.resume={resume} is not allowed: checkpoint {checkpoint.path} comes from a "
                          f"different setup ({mismatch}); use trainer.resume=none or a matching checkpoint")
    saved = checkpoint.manifest.get("format", "file")
    if saved not in strategy.readable_formats:
        raise ConfigError(f"trainer.resume={resume} is not allowed: checkpoint {checkpoint.path} has format {saved}, "
                          f"and strategy={strategy.name} reads {' or '.join(strategy.readable_formats)}; use the "
                          "strategy (and strategy.zero_stage) that wrote it, or trainer.resume=none")
    _resume_world_size(cfg, strategy, checkpoint)
    _resume_position(cfg, checkpoint, len(data.train))


def _resume_world_size(cfg: DictConfig, strategy: Strategy, checkpoint: Checkpoint) -> None:
    """A checkpoint holds global state (one file; or shards an engine can reshard) unless the strategy says its
    engine's shards only load into the world size that wrote them (DeepSpeed ZeRO)."""
    saved = checkpoint.manifest.get("world_size")
    if saved is None or saved == strategy.processes() or strategy.checkpoint_reshards:
        return
    raise ConfigError(
        f"trainer.resume={cfg.trainer.resume} is not allowed with {strategy.processes()} worker(s): checkpoint "
        f"{checkpoint.path} holds {checkpoint.manifest.get('format')} shards of {saved} workers, and strategy="
        f"{strategy.name} cannot reshard them onto another world size. Resume with {saved} workers (e.g. "
        f"strategy.nproc_per_node={saved} on one node), or start over with trainer.resume=none (DeepSpeed's "
        f"zero_to_fp32.py turns the shards into one fp32 state_dict of the weights, for use outside a resumed run)")


def _resume_position(cfg: DictConfig, checkpoint: Checkpoint, train_samples: int) -> None:
    """The saved data position must be a whole number of this run's global batches (position.py says why)."""
    batch = cfg.trainer.batch_size
    missing = sorted({"step", "epoch", "samples_in_epoch", "batch_size"} - set(checkpoint.manifest))
    if missing:
        raise ConfigError(f"trainer.resume={cfg.trainer.resume} is not allowed: checkpoint {checkpoint.path} does not "
                          f"record {', '.join(missing)} (an earlier hydra-dist wrote it); start over with "
                          "trainer.resume=none")
    position = Position.from_saved(checkpoint.manifest)
    try:
        resume_point(position, batch, max(train_samples // batch, 1))
    except PositionDoesNotFit as exc:
        raise ConfigError(f"trainer.batch_size={batch} is not allowed when resuming from {checkpoint.path}: "
                          f"{exc}") from None


def _trainer(cfg: DictConfig) -> None:
    int_at_least(cfg, "trainer.epochs", 1)
    int_at_least(cfg, "trainer.max_steps", 1, optional=True)
    int_at_least(cfg, "trainer.batch_size", 1)
    int_at_least(cfg, "trainer.grad_accum", 1)
    one_of(cfg, "trainer.precision", PRECISIONS)
    positive_number(cfg, "trainer.grad_clip", optional=True)
    int_at_least(cfg, "trainer.seed", 0)
    int_at_least(cfg, "trainer.log_every_n_steps", 1)
    int_at_least(cfg, "trainer.eval_every_n_epochs", 1)
    int_at_least(cfg, "trainer.num_workers", 0)
    one_of(cfg, "trainer.accelerator", ["auto", "cpu", "gpu"])
    int_at_least(cfg, "trainer.checkpoint_every_n_steps", 1, optional=True)
    int_at_least(cfg, "trainer.keep_checkpoints", 1)
    one_of(cfg, "trainer.on_nonfinite", ["stop", "skip"])
    number_above(cfg, "trainer.straggler_threshold", 1)
    boolean(cfg, "trainer.progress_bar")
    boolean(cfg, "trainer.log_all_ranks")
    boolean(cfg, "trainer.compile")
    channels_last = value_at(cfg, "trainer.channels_last")
    if not (isinstance(channels_last, bool) or channels_last == "auto"):
        fail("trainer.channels_last", channels_last, "expected auto, true or false")
    if cfg.trainer.accelerator == "gpu" and not torch.cuda.is_available():
        raise ConfigError("trainer.accelerator=gpu is not allowed here: no CUDA GPU is visible; use auto or cpu")


def _optimizer(cfg: DictConfig) -> None:
    value_at(cfg, "optimizer._target_")
    positive_number(cfg, "optimizer.lr")
    one_of(cfg, "optimizer.lr_scaling", ["none", "linear"])
    if "momentum" in cfg.optimizer:
        number_in(cfg, "optimizer.momentum", 0.0, 1.0, high_open=True)
    if "weight_decay" in cfg.optimizer:
        number_in(cfg, "optimizer.weight_decay", 0.0, 1.0)
    if "nesterov" in cfg.optimizer and boolean(cfg, "optimizer.nesterov") and not cfg.optimizer.get("momentum"):
        raise ConfigError(f"optimizer.nesterov=true is not allowed with optimizer.momentum="
                          f"{cfg.optimizer.get('momentum')}: Nesterov needs a momentum > 0; set one, or nesterov=false")


def _lr_schedule(cfg: DictConfig) -> None:
    if one_of(cfg, "lr_schedule.name", SCHEDULES) == "warmup_cosine":
        number_in(cfg, "lr_schedule.warmup_fraction", 0.0, 1.0, high_open=True)
        number_in(cfg, "lr_schedule.start_factor", 0.0, 1.0)
        number_in(cfg, "lr_schedule.final_factor", 0.0, 1.0)


def _dataset(cfg: DictConfig) -> Data:
    """The dataset group's own keys (each optional in a user's config), then both splits built and checked."""
    for key in ("in_memory", "download"):
        if cfg.dataset.get(key) is not None:
            boolean(cfg, f"dataset.{key}")
    for key in ("max_train_samples", "max_test_samples", "num_classes"):
        if key in cfg.dataset:
            int_at_least(cfg, f"dataset.{key}", 2 if key == "num_classes" else 1, optional=True)
    if cfg.dataset.get("in_shape") is not None:
        int_list(cfg, "dataset.in_shape", 1)
    return build_data(cfg.dataset, check=True)


def _channels_last_with(cfg: DictConfig, strategy: Strategy) -> None:
    if cfg.trainer.channels_last is True and not strategy.channels_last_ok:
        raise ConfigError(f"trainer.channels_last=true is not allowed with strategy={strategy.name}: "
                          f"{strategy.channels_last_refusal}; use auto or false")


def _precision_on_device(cfg: DictConfig, strategy: Strategy) -> None:
    precision = cfg.trainer.precision
    if precision == "fp16" and not strategy.use_cuda:
        raise ConfigError("trainer.precision=fp16 is not allowed on the CPU (it needs CUDA's GradScaler); use bf16 or fp32")
    if precision == "bf16" and strategy.use_cuda and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"trainer.precision=bf16 is not allowed on {torch.cuda.get_device_name()}: it has no bf16 support; "
            "use fp16 or fp32"
        )


def _batch_split(cfg: DictConfig, strategy: Strategy, samples: int) -> None:
    t = cfg.trainer
    processes = strategy.processes()
    if t.batch_size % (processes * t.grad_accum):
        raise ConfigError(
            f"trainer.batch_size={t.batch_size} is not allowed with {processes} process(es) x "
            f"trainer.grad_accum={t.grad_accum}: the global batch must divide evenly; use a multiple of "
            f"{processes * t.grad_accum}"
        )
    if t.batch_size > samples:
        raise ConfigError(
            f"trainer.batch_size={t.batch_size} is not allowed: the training split has only {samples} samples "
            "(dataset.max_train_samples / dataset.train_size); use a batch of at most that"
        )
