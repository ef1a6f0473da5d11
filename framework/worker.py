"""What every training process runs, whichever strategy started it: join, assemble the run from its settings
(each component from its own options), resume, fit, report. With the driver, the only code that sees the whole
config (framework/config/settings.py)."""
from __future__ import annotations

import multiprocessing
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from framework.callbacks.base import Callback, Callbacks
from framework.callbacks.faults import FaultInjection, planned_faults
from framework.callbacks.profiler import StepProfiler
from framework.checkpoints.disk import CheckpointNotWritten
from framework.checkpoints.manager import Checkpointer, choose_checkpoint
from framework.checkpoints.position import Position
from framework.checkpoints.state import signature
from framework.config.components import build_component
from framework.config.settings import Payload, Settings
from framework.data.augment import build_augment
from framework.data.build import Data, build_data
from framework.data.loaders import BatchPipeline, build_train_loader, eval_batches
from framework.errors import ConfigError
from framework.process.clean_exit import end_soon_after_a_stop_signal
from framework.process.environment import restart_attempt
from framework.models.build import build_model
from framework.results.run_result import RunResult, Stopped
from framework.strategies import build_strategy
from framework.telemetry.per_gpu import PerGpu
from framework.telemetry.progress import Console
from framework.telemetry.stall import Heartbeat, dump_nccl_flight_recorder, nccl_flight_recorder, watch_for_stalls
from framework.training.allocator import keep_freed_memory
from framework.training.interrupts import NoStop
from framework.training.metrics import build_loss, build_metrics, class_ids_of
from framework.training.optim import build_optimizer
from framework.training.speedups import apply_speedups, use_channels_last
from framework.training.trainer import LoopData, Trainer, TrainingStopped

EVAL_BATCH_PER_DEVICE = 1024


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def worker_entry(payload: Payload, strategy=None, stop=None) -> RunResult | Stopped | None:
    """Entry of every worker. `payload` holds the typed settings and the run folder: plain data, so nothing is
    composed or resolved again here. Returns rank 0's RunResult (or Stopped); other ranks return None."""
    keep_freed_memory()
    s = payload.settings
    strategy = strategy or build_strategy(s.strategy, s.trainer)
    if not strategy.runs_in_process:  # a process of its own, which its launcher stops by signal
        end_soon_after_a_stop_signal()
        if strategy.use_cuda:
            nccl_flight_recorder(Path(payload.run_dir))  # read by the process group, created in setup()
    strategy.setup()
    try:
        return _train(s, Path(payload.run_dir), payload.resume, strategy, stop or NoStop())
    except (TrainingStopped, CheckpointNotWritten) as exc:  # every rank stops here together: report it, and do
        return Stopped(str(exc)) if strategy.is_main else None  # not make the agent restart us into the same wall
    except KeyboardInterrupt:
        if multiprocessing.parent_process() is not None:  # a spawned worker: the driver reports Ctrl-C
            sys.exit(130)
        raise
    finally:
        strategy.teardown()


def _train(s: Settings, run_dir: Path, resume, strategy, stop) -> RunResult | None:
    t = s.trainer
    say = console(run_dir, strategy.is_main, t.progress_bar, t.log_all_ranks)
    faults = planned_faults()
    profiler = {"profiler": StepProfiler(*t.profile)} if t.profile else {}
    callbacks = Callbacks({**profiler, **build_callbacks(s.callbacks),
                           **({"fault_injection": FaultInjection(faults)} if faults else {})})
    try:
        seed_everything(t.seed)
        task = build_task(s, strategy)
        data, model = task.data, task.model
        micro_batch = t.batch_size // (strategy.world_size * t.grad_accum)
        # before any wrapper: FLOPs are counted on the plain module (ZeRO-3 would partition its weights in place)
        devices = PerGpu.start(strategy, model, example_input(data), micro_batch, t.precision, t.straggler_threshold,
                               say, t.straggler_intervals, t.straggler_min_gap_ms)
        wrapped = wrap(s, strategy, task)
        train_pipeline = BatchPipeline(data.normalization, data.in_shape, strategy.device, task.channels_last,
                                       build_augment(s.dataset.augment, data.in_shape))
        loader = build_train_loader(data, s.dataset.in_memory, t.seed, t.num_workers, train_pipeline, strategy.device,
                                    micro_batch, strategy.rank, strategy.world_size)
        loop_data = LoopData(loader, micro_batch, test_batches(s, strategy, task), task.step, task.loss, task.metrics)
        checkpointer = Checkpointer(strategy, run_dir, t.checkpoint_every_n_steps, t.keep_checkpoints, t.batch_size,
                                    signature(s.model, s.dataset.display_name, s.optimizer._target_, data.in_shape,
                                              data.num_classes), say)
        heartbeat = Heartbeat()
        trainer = Trainer(t, strategy=strategy, wrapped=wrapped, data=loop_data, lr_schedule=s.lr_schedule,
                          checkpointer=checkpointer, callbacks=callbacks, devices=devices, stop=stop, say=say,
                          run_dir=run_dir, hparams=hparams_of(s, strategy),
                          model_record=model_record(s, data), heartbeat=heartbeat)
        start = Position()
        checkpoint = resume if restart_attempt() == 0 else checkpoint_after_restart(s, run_dir, strategy, say)
        if checkpoint is not None:
            start = trainer.resume(checkpoint)
        say(
            f"training {s.model_name} on {s.dataset.display_name} with strategy={strategy.name}: "
            f"{strategy.world_size} process(es) on {strategy.device.type}, global batch {t.batch_size} = "
            f"{strategy.world_size} x {micro_batch} per process x {t.grad_accum} accumulation, "
            f"{trainer.total_steps} steps"
        )
        nccl = strategy.use_cuda and not strategy.runs_in_process
        dump = (lambda: dump_nccl_flight_recorder(strategy.rank)) if nccl else None
        with watch_for_stalls(t.stall_timeout, heartbeat, run_dir, strategy.rank, strategy.world_size, say,
                              checkpointer.last_saved, before_exit=dump):
            totals = trainer.fit(start)
        if not strategy.is_main:
            return None
        last = checkpointer.last_saved()
        return RunResult(
            test_metrics=dict(totals.val_metrics), objective=t.objective, test_loss=totals.val_loss,
            train_loss=totals.train_loss, samples_per_sec=totals.samples / totals.seconds if totals.seconds else 0.0,
            per_rank_samples_per_sec=totals.per_slot_samples_per_sec(), per_rank_max_memory_gib=totals.slot_max_mem_gib,
            train_seconds=totals.seconds, steps=trainer.step, skipped_steps=totals.skipped_steps,
            epochs=trainer.epoch + 1 if trainer.stop_requested else trainer.epochs, processes=strategy.world_size,
            global_batch=t.batch_size, micro_batch=micro_batch,
            strategy=strategy.name, device=strategy.device.type, resumed_from_step=start.step,
            checkpoint=str(last or ""),
        )
    finally:
        callbacks.close()
        say.close()


@dataclass
class Task:
    """What a run trains or evaluates, built from its settings in every worker: the data, the plain model (on the
    CPU, before any wrapper), the step, the loss and the metrics, and the memory layout the model and batches share."""

    data: Data
    model: nn.Module
    step: object
    loss: object
    metrics: dict
    channels_last: bool


def build_task(s: Settings, strategy) -> Task:
    loss = build_loss(s.loss)
    data = build_data(s.dataset, class_ids_of(loss, build_metrics(s.metrics)))
    model = build_model(s.model, data.in_shape, data.num_classes)
    # resolved once: the model's layout and the batches' layout must agree
    channels_last = use_channels_last(s.trainer.channels_last, model, strategy.device, data.in_shape,
                                      strategy.channels_last_refusal is None)
    return Task(data, model, build_component(s.step, "step"), loss, build_metrics(s.metrics, data.num_classes),
                channels_last)


def wrap(s: Settings, strategy, task: Task):
    """The task's model with its speed-ups, on the device and in the strategy's wrapper, with its optimizer."""
    t = s.trainer
    model = apply_speedups(task.model, task.channels_last, t.compile, strategy.device,
                           move=not strategy.moves_model_itself)
    workers = strategy.world_size * strategy.local_slots()
    return strategy.wrap(model, lambda params: build_optimizer(s.optimizer, params, workers))


def test_batches(s: Settings, strategy, task: Task):
    """A function giving this rank's share of the test split, in batches on its device (never augmented)."""
    pipeline = BatchPipeline(task.data.normalization, task.data.in_shape, strategy.device, task.channels_last)
    return lambda: eval_batches(task.data.test, pipeline, strategy.device, EVAL_BATCH_PER_DEVICE, strategy.rank,
                                strategy.world_size, s.trainer.num_workers)


def example_input(data) -> object:
    """The first training sample's input as the model gets it (normalized where the dataset says how): what FLOPs
    are counted on."""
    return BatchPipeline(data.normalization, data.in_shape, torch.device("cpu"))(data.example[0])


def checkpoint_after_restart(s: Settings, run_dir: Path, strategy, say):
    """After the elastic agent restarted the worker group: rank 0 picks (and verifies) the newest valid checkpoint
    of the run, and every rank resumes that one; no other rank reads the folder's files to check them again."""
    chosen = choose_checkpoint(s.trainer.resume, run_dir, warn=say) if strategy.is_main else None
    return strategy.broadcast_object(chosen)


def build_callbacks(nodes: dict) -> dict[str, Callback]:
    """The callbacks group's components by name, in order (fault injection, when HYDRA_DIST_FAULT asks for it, comes
    after them in the workers only)."""
    callbacks = {}
    for name, node in (nodes or {}).items():
        callback = build_component(node, f"callbacks.{name}")
        if not isinstance(callback, Callback):
            raise ConfigError(f"callbacks.{name}._target_={node['_target_']} is not allowed: it built a "
                              f"{type(callback).__name__}, not a framework.callbacks.base.Callback")
        callbacks[str(name)] = callback
    return callbacks


def model_record(s: Settings, data: Data) -> dict:
    """What rebuilds the model outside a run (framework/results/trained_model.py)."""
    return {"model_config": s.model, "in_shape": data.in_shape, "num_classes": data.num_classes}


def console(run_dir: Path, is_main: bool, progress_bar: bool, log_all_ranks: bool) -> Console:
    """Rank 0: a progress bar on a terminal (plain lines otherwise) and every line in the run folder's train.log.
    Other ranks: their own plain lines with trainer.log_all_ranks=true, else nothing."""
    if is_main:
        return Console(run_dir / "train.log", bar=progress_bar)
    return Console(bar=False, quiet=not log_all_ranks)


def hparams_of(s: Settings, strategy) -> dict:
    t = s.trainer
    return {
        "strategy": strategy.name, "model": s.model_name, "dataset": s.dataset.display_name,
        "optimizer": s.optimizer._target_.rsplit(".", 1)[-1], "lr": float(s.optimizer.lr),
        "global_batch": t.batch_size, "grad_accum": t.grad_accum, "precision": t.precision, "seed": t.seed,
    }
