"""What a callback may read and call: one LoopState, the same object at every hook of a run (docs/loop-features.md,
"Writing a callback"). The Trainer owns it and moves its step, epoch and totals on; a callback reads them and asks
through its few methods (the collectives, the full weights, the best checkpoint kept apart, a stop, a context for
evaluations), so nothing outside the loop reaches into the Trainer or the engine's objects."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from framework.config.trainer import TrainerConfig
from framework.telemetry.meters import IntervalSummary
from framework.telemetry.traffic import GradientBytesMeter
from framework.training.callback import Callbacks
from framework.training.checkpointing import Checkpointer
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.param_groups import group_lrs


@dataclass(kw_only=True)
class RunTotals:
    """Rank 0's running totals over every logged interval (checkpointed, so a resumed run keeps them)."""

    samples: float = 0.0
    seconds: float = 0.0
    slot_samples: list[float] = field(default_factory=list)
    slot_seconds: list[float] = field(default_factory=list)
    slot_max_mem_gib: list[float] = field(default_factory=list)  # the run's peak per GPU (CUDA; 0 on the CPU)
    train_loss: float = math.nan
    val_loss: float = math.nan
    val_metrics: dict[str, float] = field(default_factory=dict)
    skipped_steps: int = 0
    # gradient traffic over the intervals whose steps all sent uncompressed and those whose steps all sent compressed:
    # kept here (checkpointed), counted by framework/telemetry/traffic.py: GradientBytesMeter.add_to_run
    uncompressed: dict[str, float] = field(default_factory=dict)
    compressed: dict[str, float] = field(default_factory=dict)

    def add(self, s: IntervalSummary) -> None:
        self.samples += s.samples
        self.seconds += s.seconds
        slots = len(s.per_slot_samples)
        if len(self.slot_samples) != slots:
            self.slot_samples, self.slot_seconds = [0.0] * slots, [0.0] * slots
        if len(self.slot_max_mem_gib) != slots:
            self.slot_max_mem_gib = [0.0] * slots
        peaks = s.columns.get("max_mem_gib", [math.nan] * slots)  # NaN on the CPU (MemoryMeter)
        for i in range(slots):
            self.slot_samples[i] += s.per_slot_samples[i]
            self.slot_seconds[i] += s.seconds  # the job's time, as each interval's rates: the ranks add up to the job
            if peaks[i] == peaks[i]:
                self.slot_max_mem_gib[i] = max(self.slot_max_mem_gib[i], peaks[i])
        if s.trained:  # an interval of skipped steps has no loss
            self.train_loss = s.loss
        GradientBytesMeter.add_to_run(s, self.uncompressed, self.compressed)

    def traffic(self) -> dict[str, float]:
        """What RunResult reports of the gradient traffic (framework/telemetry/traffic.py)."""
        return GradientBytesMeter.run_result(self.uncompressed, self.compressed)

    @property
    def samples_per_sec(self) -> float:
        """The run's samples over the seconds of its logged intervals."""
        return self.samples / self.seconds if self.seconds else 0.0

    def final_metrics(self) -> dict[str, float]:
        """What the loggers write at the run's end: each metric's last evaluation as test_<name>, test_loss and
        train_loss."""
        return {**{f"test_{name}": value for name, value in self.val_metrics.items()},
                "test_loss": self.val_loss, "train_loss": self.train_loss}

    def per_slot_samples_per_sec(self) -> list[float]:
        return [n / s if s > 0 else 0.0 for n, s in zip(self.slot_samples, self.slot_seconds)]


@dataclass
class EvalResult:
    """One evaluation on the test split, on rank 0: mean loss and each metric's mean per-sample score."""

    loss: float
    metrics: dict[str, float]


@dataclass(kw_only=True)
class RunInfo:
    """The run the loop trains in: its folder, rank 0's console, the hyperparameters the HParams tab shows, what
    rebuilds the model (weights files), the stop a signal requests, what writes its checkpoints and what watches it."""

    run_dir: Path
    say: object  # rank 0's console and train.log (framework/telemetry/progress.py: Console)
    hparams: dict
    model_record: dict  # the model's config, in_shape and num_classes
    stop: object  # framework/training/interrupts.py: .requested, .signum
    checkpointer: Checkpointer
    callbacks: Callbacks


class LoopState:
    """What every hook gets. Read: where the loop is (step, epoch, epochs, total_steps, checkpoint_due, totals), who
    this process is (rank, world_size, is_main, device, devices), what it trains (model, optimizer, lr(), lrs()), the run
    (run_dir, options, hparams(), model_record, objective, higher_is_better, stop_signalled). Call: say(), the collectives (on
    every rank alike), full_model_state(), keep_checkpoint_as_best(), request_stop(), evaluate_inside(), log_scalar()."""

    def __init__(self, options: TrainerConfig, group: ProcessGroup, wrapped: Wrapped, run: RunInfo,
                 total_steps: int | None, epochs: int, *, higher_is_better: bool):
        self.options = options  # the trainer group's settings (framework/config/trainer.py)
        self.run_dir, self.say, self.model_record = run.run_dir, run.say, run.model_record
        self.model = wrapped.module  # the user's module inside every wrapper: what weights files hold
        self.optimizer = wrapped.optimizer
        self.total_steps, self.epochs = total_steps, epochs
        self.higher_is_better = higher_is_better  # of trainer.objective: accuracy-like metrics yes, loss no
        # what the loop moves on
        self.step = 0  # optimizer steps done
        self.epoch = 0  # the epoch in progress, from 0
        self.totals = RunTotals()
        self.checkpoint_due = False  # in on_log: a checkpoint follows this log boundary
        self.stop_reason: str | None = None  # request_stop()'s reason: the run ends after this evaluation
        self.evaluation_contexts: list = []  # what evaluate_inside() added; the loop enters each per evaluation
        self._group, self._wrapped, self._checkpointer, self._hparams = group, wrapped, run.checkpointer, run.hparams
        self._stop = run.stop
        self._logged: dict[str, float] = {}  # log_scalar()'s, until the next log boundary takes them

    # ---- who this process is, and the collectives (every rank must call a collective, or the others wait) ----
    @property
    def rank(self) -> int:
        return self._group.rank

    @property
    def world_size(self) -> int:
        return self._group.world_size

    @property
    def is_main(self) -> bool:
        return self._group.is_main

    @property
    def device(self) -> torch.device:
        return self._group.device

    @property
    def devices(self) -> list[torch.device]:
        """Every device this process trains on (dp: one per replica)."""
        return self._group.devices

    def broadcast_object(self, obj):
        """Rank 0's obj on every rank (the others pass anything, e.g. None)."""
        return self._group.broadcast_object(obj)

    def gather_objects(self, obj) -> list:
        """Every rank's obj (picklable; tensors on the CPU), in rank order, on every rank."""
        return self._group.gather_objects(obj)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's t, in t (in place) and returned. t may live anywhere (a callback's CPU tensor):
        it travels on the group's device, which nccl needs (CUDA tensors only), and comes back to t's."""
        if t.device == self.device:
            return self._group.all_reduce_sum(t)
        total = self._group.all_reduce_sum(t.to(self.device))
        return t.copy_(total)

    def barrier(self) -> None:
        self._group.barrier()

    # ---- the run --------------------------------------------------------------------------------------------
    def lr(self) -> float:
        """The first param group's lr (the default group's: optimizer.param_groups)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def lrs(self) -> dict[str, float]:
        """Every param group's lr by its name (the default group is `default`; framework/training/param_groups.py)."""
        return group_lrs(self.optimizer)

    def hparams(self) -> dict:
        """The run's hyperparameters, as the HParams tab shows them."""
        return {**self._hparams, "processes": self.world_size, "epochs": self.epochs}

    @property
    def stop_signalled(self) -> bool:
        """A signal asked the run to stop: it stops at this step's boundary, once the hooks return."""
        return self._stop.requested

    @property
    def objective(self) -> str:
        """What the run optimizes: trainer.objective, a metric's name or loss."""
        return self.options.objective

    def objective_value(self, result: EvalResult) -> float:
        return result.loss if self.objective == "loss" else result.metrics[self.objective]

    # ---- what a callback may ask of the loop ----------------------------------------------------------------
    def full_model_state(self) -> dict:
        """Every rank calls it (an engine that shards the model gathers it): the model's whole state dict on rank 0,
        under the model's own keys; what the other ranks get is the engine's (framework/training/checkpoint_io.py)."""
        return self._wrapped.checkpoint_io.full_model_state(self._wrapped.module)

    def keep_checkpoint_as_best(self, step: int) -> None:
        """Every rank: the checkpoint just committed for `step` becomes checkpoints/best/ (hard links), replacing the
        one kept before."""
        self._checkpointer.keep_best(step)

    def request_stop(self, reason: str) -> None:
        """End the run after the current evaluation (call it on every rank, with the same decision)."""
        self.stop_reason = reason

    def log_scalar(self, tag: str, value: float) -> None:
        """A number of the callback's own, written by every logger of the run (TensorBoard, CSV, MLflow, W&B) at the
        next log boundary, under `tag` at that boundary's step; logged again before then, the last value. Rank 0's
        are written: the loggers are rank 0's (gather_objects first for every rank's)."""
        if not isinstance(tag, str) or not tag:
            raise ValueError(f"log_scalar: the tag must be a non-empty string, not {tag!r}")
        self._logged[tag] = float(value)

    def take_logged(self) -> dict[str, float]:
        """The loop, at a log boundary: what log_scalar() gathered since the last one, and a fresh start."""
        logged, self._logged = self._logged, {}
        return logged

    def evaluate_inside(self, context) -> None:
        """Every later evaluation runs inside `context()`, a context-manager factory (the EMA swaps its average in)."""
        self.evaluation_contexts.append(context)
