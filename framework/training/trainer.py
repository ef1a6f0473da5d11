"""The one training loop, shared by every strategy. Strategy-specific work is behind the strategy and what its
wrap() returned; what watches the loop (console, TensorBoard, fault injection, a user's own) is a callback."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from framework.callbacks.base import Callbacks
from framework.checkpoints.position import Position, resume_point
from framework.config.trainer import TrainerConfig
from framework.strategies.base import Strategy, Wrapped
from framework.telemetry.meters import COLUMNS, FIRST_NONFINITE, IntervalMeter, IntervalSummary
from framework.training.interrupts import Interrupted
from framework.training.lr_schedule import LrSchedule
from framework.training.metrics import per_sample_losses


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (a NaN/inf loss); the message says why and what is kept."""


@dataclass
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

    def add(self, s: IntervalSummary) -> None:
        self.samples += s.samples
        self.seconds += s.seconds
        slots = len(s.per_slot_samples)
        if len(self.slot_samples) != slots:
            self.slot_samples, self.slot_seconds = [0.0] * slots, [0.0] * slots
        if len(self.slot_max_mem_gib) != slots:
            self.slot_max_mem_gib = [0.0] * slots
        for i in range(slots):
            self.slot_samples[i] += s.per_slot_samples[i]
            self.slot_seconds[i] += s.per_slot_seconds[i]
            self.slot_max_mem_gib[i] = max(self.slot_max_mem_gib[i], s.per_slot_max_mem_gib[i])
        self.train_loss = s.loss

    def per_slot_samples_per_sec(self) -> list[float]:
        return [n / s if s > 0 else 0.0 for n, s in zip(self.slot_samples, self.slot_seconds)]


@dataclass
class EvalResult:
    """One evaluation on the test split, on rank 0: mean loss and each metric's mean per-sample score."""

    loss: float
    metrics: dict[str, float]


@dataclass
class LoopData:
    """The batches the loop trains and evaluates on."""

    train_loader: object  # framework/data/loaders.py: set_epoch(e), iterate(start), len()
    micro_batch: int
    eval_batches: object  # a function returning this rank's test batches
    loss: object  # loss(outputs, targets) -> per-sample losses or their mean
    metrics: dict  # name -> metric(outputs, targets) -> the batch's sum of a per-sample score


class Trainer:
    def __init__(self, options: TrainerConfig, *, strategy: Strategy, wrapped: Wrapped, data: LoopData, lr_schedule,
                 checkpointer, callbacks: Callbacks, devices, stop, say, run_dir: Path, hparams: dict):
        self.options, self.strategy, self.wrapped, self.data = options, strategy, wrapped, data
        self.checkpointer, self.callbacks, self.devices, self.stop, self.say = checkpointer, callbacks, devices, stop, say
        self.run_dir, self._hparams = run_dir, hparams
        self.is_main = strategy.is_main
        self.totals = RunTotals()
        self.epoch = 0
        self.checkpoint_due = False  # a checkpoint follows the log boundary in progress
        self.steps_per_epoch = len(data.train_loader) // options.grad_accum
        if self.steps_per_epoch < 1:
            raise ValueError("the training split is smaller than one global batch")
        planned = options.epochs * self.steps_per_epoch
        self.total_steps = min(options.max_steps, planned) if options.max_steps else planned
        self.epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        self.lr_schedule = LrSchedule(lr_schedule, self.total_steps)
        self.lr_schedule.attach(wrapped.optimizer)
        memory_devices = [torch.device("cuda", i) for i in strategy.cuda_devices()]
        slot_sizes = strategy.slot_sizes(data.micro_batch)
        self.meter = IntervalMeter(slot_sizes, strategy.device, memory_devices, wrapped.clock)
        caveat = getattr(wrapped.clock, "caveat", None)
        if caveat and len(slot_sizes) > 1 and self.is_main:
            say(f"note: {caveat}")

    def restore_totals(self, totals: dict) -> None:
        if totals:
            self.totals = RunTotals(**totals)

    def lr(self) -> float:
        return float(self.wrapped.optimizer.param_groups[0]["lr"])

    def hparams(self) -> dict:
        """The run's hyperparameters, as the HParams tab shows them."""
        return {**self._hparams, "processes": self.strategy.world_size, "epochs": self.epochs}

    def fit(self, start: Position = Position()) -> RunTotals:
        """Train from `start` (framework/checkpoints/position.py: why the data position is counted in samples, and
        how a run on another world size or batch continues the epoch without a sample twice or skipped)."""
        try:
            self.callbacks.on_fit_start(self)
            self._fit(start)
            self.callbacks.on_fit_end(self)
        except BaseException as exc:
            self.callbacks.on_exception(self, exc)
            raise
        return self.totals

    def _fit(self, start: Position) -> None:
        k, batch = self.options.grad_accum, self.options.batch_size
        resumed = resume_point(start, batch, self.steps_per_epoch)
        step = resumed.step
        self.meter.reset()  # the time since __init__ (a checkpoint being loaded) is not training time
        for epoch in range(resumed.epoch, self.epochs):
            self.epoch = epoch
            first = resumed.steps_in_epoch if epoch == resumed.epoch else 0
            last = min(self.steps_per_epoch, first + self.total_steps - step)
            self.wrapped.model.train()
            loader = self.data.train_loader
            loader.set_epoch(epoch)
            batches = loader.iterate(first * k)
            for batch_in_epoch in range(first + 1, last + 1):
                step += 1
                self.callbacks.on_train_step_start(self, step)
                self._train_step(batches, step)
                self.callbacks.on_train_step_end(self, step)
                epoch_end = batch_in_epoch == self.steps_per_epoch or step == self.total_steps
                stopping = self.stop.requested  # read once: a signal may land anywhere below
                checkpoint_due = stopping or self.checkpointer.due(step, epoch_end)
                self.checkpoint_due = checkpoint_due
                if step % self.options.log_every_n_steps == 0 or checkpoint_due:
                    self._log(step)
                if checkpoint_due:
                    path = self.checkpointer.save(self.wrapped, Position(step, epoch, batch_in_epoch * batch, batch),
                                                  asdict(self.totals))
                    self.callbacks.on_checkpoint_saved(self, step, path)
                if stopping:
                    raise Interrupted(self.stop.signum)
            self.checkpoint_due = False
            if self.meter.steps:
                self._log(step)
            if (epoch + 1) % self.options.eval_every_n_epochs == 0 or epoch == self.epochs - 1:
                self._evaluate(step)
            self.meter.reset()  # evaluation time is not training time

    def _train_step(self, batches, step: int) -> None:
        k = self.options.grad_accum
        model, optimizer, precision = self.wrapped.model, self.wrapped.optimizer, self.wrapped.precision
        # Gradients are dropped here, while the forward pass is about to allocate: dropping them right after
        # optimizer.step() left the heap top free, glibc returned it to the OS and every step paid for page
        # faults again (zero_grad took 2.7 ms instead of 0.1 ms, 15% of a LeNet step on CPU).
        optimizer.zero_grad(set_to_none=True)
        losses = []
        for micro in range(k):
            fetch_start = time.perf_counter()
            x, y = next(batches)
            self.meter.add_data_time(time.perf_counter() - fetch_start)
            with self.strategy.sync(model, on=micro == k - 1):
                with precision.autocast():
                    outputs = model(x)
                per_sample = per_sample_losses(self.data.loss, outputs.float(), y)
                precision.backward(per_sample.mean() / k)
            losses.append(per_sample)
        self.lr_schedule.apply(optimizer, step)
        if not precision.optimizer_step(model, optimizer, self.options.grad_clip, self.options.on_nonfinite == "skip"):
            self.totals.skipped_steps += 1
            self.say(f"step {step}: non-finite loss or gradient, step skipped (trainer.on_nonfinite=skip)")
            self.meter.add_step(step)
            return
        for per_sample in losses:
            self.meter.add_micro_batch(per_sample)
        self.meter.add_step(step)

    def _log(self, step: int) -> None:
        rows = self.meter.rows(self.strategy.optimizer_state_bytes(self.wrapped.optimizer))
        rows = self.strategy.all_gather(rows).reshape(-1, len(COLUMNS)).cpu()
        self.meter.reset()
        self._stop_if_nonfinite(rows)
        report = None
        if self.is_main:
            summary = IntervalSummary.from_rows(rows)
            self.totals.add(summary)
            report = self.devices.report(summary)
        self.callbacks.on_log(self, step, report)

    def _stop_if_nonfinite(self, rows: torch.Tensor) -> None:
        """Every rank sees the same gathered rows, so every rank stops at the same boundary."""
        bad = [(rank, int(s)) for rank, s in enumerate(rows[:, FIRST_NONFINITE].tolist()) if s > 0]
        if not bad:
            return
        rank, step = min(bad, key=lambda b: b[1])
        last = self.checkpointer.last_saved()
        kept = f"the last good checkpoint is {last}" if last else "no checkpoint had been written yet"
        raise TrainingStopped(
            f"the training loss became NaN/inf at step {step} on rank {rank}; stopped "
            f"(trainer.on_nonfinite=stop); {kept}. Lower optimizer.lr, set trainer.grad_clip, "
            "use trainer.precision=fp32, or trainer.on_nonfinite=skip"
        )

    @torch.no_grad()
    def _evaluate(self, step: int) -> None:
        self.callbacks.on_evaluation_start(self, step)
        model = self.strategy.eval_model(self.wrapped.model)
        model.eval()
        names = list(self.data.metrics)
        # count, loss sum, then each metric's sum of per-sample scores
        sums = torch.zeros(2 + len(names), device=self.strategy.device, dtype=torch.float64)
        for x, y in self.data.eval_batches():
            with self.wrapped.precision.autocast():
                outputs = model(x).float()
            sums[0] += len(y)
            sums[1] += per_sample_losses(self.data.loss, outputs, y).sum()
            for j, name in enumerate(names):
                sums[2 + j] += self.data.metrics[name](outputs, y)
        count, loss_sum, *metric_sums = self.strategy.all_reduce_sum(sums).tolist()
        result = None
        if self.is_main:
            count = max(count, 1)
            result = EvalResult(loss_sum / count, {name: total / count for name, total in zip(names, metric_sums)})
            self.totals.val_loss, self.totals.val_metrics = result.loss, result.metrics
        self.callbacks.on_evaluation_end(self, step, result)
