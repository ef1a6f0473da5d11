"""What every training process runs, whichever strategy started it: join, build, resume, fit, report."""
from __future__ import annotations

import multiprocessing
import random
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from framework.training.allocator import keep_freed_memory
from framework.checkpoints.disk import CheckpointNotWritten, OffWhenUnwritable
from framework.checkpoints.manager import Checkpointer, choose_checkpoint
from framework.checkpoints.state import Position, signature
from framework.data.augment import build_augment
from framework.data.build import build_data, dataset_name
from framework.data.loaders import BatchPipeline, build_train_loader, eval_batches
from framework.callbacks.faults import Faults
from framework.training.interrupts import NoStop
from framework.training.metrics import build_loss, build_metrics
from framework.models.build import build_model
from framework.training.optim import build_optimizer
from framework.telemetry.per_gpu import PerGpu
from framework.telemetry.progress import Console
from framework.training.speedups import apply_speedups, use_channels_last
from framework.strategies import build_strategy
from framework.telemetry.tensorboard_logger import TensorBoardLogger
from framework.training.trainer import Trainer, TrainingStopped

EVAL_BATCH_PER_DEVICE = 1024


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def worker_entry(payload: dict, strategy=None, stop=None) -> dict | None:
    """Entry of every worker. `payload` holds the resolved config and the run folder; it is plain
    data, so nothing is re-resolved here (no second `${now:}`, no second Hydra run).
    Returns rank 0's result (or {"stopped": why}); other ranks return None."""
    keep_freed_memory()
    cfg = OmegaConf.create(payload["cfg"])
    strategy = strategy or build_strategy(cfg)
    strategy.setup()
    try:
        return _train(cfg, Path(payload["run_dir"]), strategy, stop or NoStop())
    except (TrainingStopped, CheckpointNotWritten) as exc:  # every rank stops here together: report it, and do
        return {"stopped": str(exc)} if strategy.is_main else None  # not make the agent restart us into the same wall
    except KeyboardInterrupt:
        if multiprocessing.parent_process() is not None:  # a spawned worker: the driver reports Ctrl-C
            sys.exit(130)
        raise
    finally:
        strategy.teardown()


def _train(cfg, run_dir: Path, strategy, stop) -> dict | None:
    say = console(run_dir, strategy.is_main, cfg.trainer)
    t = cfg.trainer
    seed_everything(t.seed)
    data = build_data(cfg.dataset)
    model = build_model(cfg.model, data.in_shape, data.num_classes)
    micro_batch = t.batch_size // (strategy.world_size * t.grad_accum)
    # before any wrapper: FLOPs are counted on the plain module (ZeRO-3 would partition its weights in place)
    per_gpu = PerGpu.start(strategy, model, data.in_shape, micro_batch, t, say)
    # resolved once: the model's layout and the batches' layout must agree
    channels_last = use_channels_last(t.channels_last, model, strategy.device, data.in_shape, strategy.channels_last_ok)
    model = strategy.wrap_model(apply_speedups(model, {"channels_last": channels_last, "compile": t.compile},
                                               strategy.device, move=not strategy.moves_model_itself))
    workers = strategy.world_size * strategy.local_slots()
    optimizer = build_optimizer(cfg, model.parameters(), workers)
    model, optimizer = strategy.wrap_optimizer(model, optimizer)
    augment = build_augment(cfg.dataset, data.in_shape)
    train_pipeline = BatchPipeline(data.normalization, data.in_shape, strategy.device, channels_last, augment)
    eval_pipeline = BatchPipeline(data.normalization, data.in_shape, strategy.device, channels_last)  # no augment
    loader = build_train_loader(data, cfg, train_pipeline, strategy.device, micro_batch, strategy.rank,
                                strategy.world_size)
    precision = strategy.make_precision(t.precision)
    faults = Faults(strategy.rank, slow_steps=not strategy.slows_replicas)
    checkpointer = Checkpointer(cfg, strategy, run_dir, signature(cfg, data.in_shape, data.num_classes), faults, say)
    loss, metrics = build_loss(cfg), build_metrics(cfg, data.num_classes)

    def test_batches():
        return eval_batches(data.test, eval_pipeline, strategy.device, EVAL_BATCH_PER_DEVICE, strategy.rank,
                            strategy.world_size, t.num_workers)

    tb = None
    if strategy.is_main:
        tb = OffWhenUnwritable(TensorBoardLogger(run_dir, strategy.device.type == "cuda"), "TensorBoard's event file",
                               say)
    try:
        trainer = Trainer(cfg, strategy, model, optimizer, loader, micro_batch, test_batches, precision, tb, say,
                          checkpointer, faults, stop, loss, metrics, per_gpu)
        start = Position()
        checkpoint = choose_checkpoint(t.resume, run_dir, warn=say)
        if checkpoint is not None:
            start, totals = checkpointer.resume(checkpoint, model, optimizer, precision.scaler)
            trainer.restore_totals(totals)
        say(
            f"training {cfg.model._target_.rsplit('.', 1)[-1]} on {dataset_name(cfg.dataset)} with strategy={strategy.name}: "
            f"{strategy.world_size} process(es) on {strategy.device.type}, global batch {t.batch_size} = "
            f"{strategy.world_size} x {micro_batch} per process x {t.grad_accum} accumulation, "
            f"{trainer.total_steps} steps"
        )
        totals = trainer.fit(start)
        if not strategy.is_main:
            return None
        result = {
            **{f"test_{name}": value for name, value in totals.val_metrics.items()},
            "metrics": list(totals.val_metrics),
            "objective": t.objective,
            "test_loss": totals.val_loss,
            "train_loss": totals.train_loss,
            "samples_per_sec": totals.samples / totals.seconds if totals.seconds else 0.0,
            "per_rank_samples_per_sec": totals.per_slot_samples_per_sec(),
            "per_rank_max_memory_gib": totals.slot_max_mem_gib,
            "train_seconds": totals.seconds,
            "steps": trainer.total_steps,
            "skipped_steps": totals.skipped_steps,
            "epochs": trainer.epochs,
            "processes": strategy.world_size,
            "global_batch": t.batch_size,
            "micro_batch": micro_batch,
            "strategy": strategy.name,
            "device": strategy.device.type,
            "resumed_from_step": start.step,
            "checkpoint": str(checkpointer.last_saved() or ""),
        }
        tb.log_hparams(hparams_of(cfg, result), {
            **{f"hparam/test_{name}": value for name, value in totals.val_metrics.items()},
            "hparam/test_loss": result["test_loss"], "hparam/train_loss": result["train_loss"],
            "hparam/samples_per_sec": result["samples_per_sec"],
        })
        return result
    finally:
        say.close()
        if tb:
            tb.close()


def console(run_dir: Path, is_main: bool, t) -> Console:
    """Rank 0: a progress bar on a terminal (plain lines otherwise) and every line in the run folder's train.log.
    Other ranks: their own plain lines with trainer.log_all_ranks=true, else nothing."""
    if is_main:
        return Console(run_dir / "train.log", bar=t.progress_bar)
    return Console(bar=False, quiet=not t.log_all_ranks)


def hparams_of(cfg, result: dict) -> dict:
    return {
        "strategy": result["strategy"],
        "model": cfg.model._target_.rsplit(".", 1)[-1],
        "dataset": dataset_name(cfg.dataset),
        "optimizer": cfg.optimizer._target_.rsplit(".", 1)[-1],
        "lr": float(cfg.optimizer.lr),
        "global_batch": cfg.trainer.batch_size,
        "processes": result["processes"],
        "grad_accum": cfg.trainer.grad_accum,
        "precision": cfg.trainer.precision,
        "epochs": result["epochs"],
        "seed": cfg.trainer.seed,
    }
