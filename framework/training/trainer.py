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
from framework.telemetry.stall import Heartbeat
from framework.training.interrupts import Interrupted
from framework.training.lr_schedule import LrSchedule
from framework.training.metrics import EvalMetrics, higher_is_better, per_sample_losses


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
    """The batches the loop trains and evaluates on, and how it scores them."""

    train_loader: object  # framework/data/loaders.py: set_epoch(e), iterate(start), len()
    micro_batch: int
    eval_batches: object  # a function returning this rank's test batches
    step: object  # framework/training/step.py: step(model, batch, loss) -> StepOutput
    loss: object  # loss(outputs, targets) -> per-sample losses (or per element of a sample), or their mean
    metrics: dict  # name -> a torchmetrics.Metric, or metric(outputs, targets) -> the batch's sum of a per-sample score


class Trainer:
    def __init__(self, options: TrainerConfig, *, strategy: Strategy, wrapped: Wrapped, data: LoopData, lr_schedule,
                 checkpointer, callbacks: Callbacks, devices, stop, say, run_dir: Path, hparams: dict,
                 model_record: dict, heartbeat: Heartbeat | None = None):
        self.options, self.strategy, self.wrapped, self.data = options, strategy, wrapped, data
        self.checkpointer, self.callbacks, self.devices, self.stop, self.say = checkpointer, callbacks, devices, stop, say
        self.run_dir, self._hparams = run_dir, hparams
        self.model_record = model_record  # the model's config, in_shape and num_classes: what rebuilds it
        self.heartbeat = heartbeat or Heartbeat()  # where the loop is, for the stall watchdog's thread
        self.is_main = strategy.is_main
        self.totals = RunTotals()
        self.epoch = 0
        self.step = 0  # optimizer steps done
        self.stop_requested: str | None = None  # a callback's reason to end after this evaluation (every rank alike)
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

    def resume(self, checkpoint) -> Position:
        """Every rank: model, optimizer, totals and the callbacks' states from a checkpoint; its position."""
        position, totals, callbacks = self.checkpointer.resume(checkpoint, self.wrapped)
        if totals:
            self.totals = RunTotals(**totals)
        self.callbacks.load_state_dict(callbacks)
        return position

    def export_weights(self, name: str) -> Path | None:
        """Every rank calls it (a sharding engine gathers): the model's full weights into weights/<name>.pt, written
        by rank 0 (framework/checkpoints/weights.py); the path there, None elsewhere."""
        from framework.checkpoints.weights import write_weights

        state = self.strategy.checkpoints.full_model_state(self.wrapped)
        if not self.is_main:
            return None
        objective = {"name": self.objective, "value": self.totals.val_loss if self.objective == "loss"
                     else self.totals.val_metrics.get(self.objective)}
        try:
            return write_weights(self.run_dir, name, state, step=self.step, objective=objective, **self.model_record)
        except OSError as error:  # a by-product of the checkpoints, which keep the same weights: the run goes on
            self.say(f"warning: weights/{name}.pt could not be written in {self.run_dir}: {error.strerror or error}; "
                     f"the checkpoints hold the same model")
            return None

    def lr(self) -> float:
        return float(self.wrapped.optimizer.param_groups[0]["lr"])

    def request_stop(self, reason: str) -> None:
        """End the run after the current evaluation (call it on every rank, with the same decision)."""
        self.stop_requested = reason

    @property
    def objective(self) -> str:
        """What the run optimizes: trainer.objective, a metric's name or loss."""
        return self.options.objective

    def objective_value(self, result: EvalResult) -> float:
        return result.loss if self.objective == "loss" else result.metrics[self.objective]

    @property
    def higher_is_better(self) -> bool:
        return self.objective != "loss" and higher_is_better(self.data.metrics[self.objective])

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
        step = self.step = resumed.step
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
                self.step = step
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
                    self.heartbeat.beat(step, "checkpoint")
                    path = self.checkpointer.save(self.wrapped, Position(step, epoch, batch_in_epoch * batch, batch),
                                                  asdict(self.totals), self.callbacks.state_dict())
                    self.callbacks.on_checkpoint_saved(self, step, path)
                if stopping:
                    raise Interrupted(self.stop.signum)
            self.checkpoint_due = False
            if self.meter.steps:
                self._log(step)
            if (epoch + 1) % self.options.eval_every_n_epochs == 0 or epoch == self.epochs - 1:
                self._evaluate(step)
            self.meter.reset()  # evaluation time is not training time
            if self.stop_requested:
                self.say(f"stopped after epoch {epoch + 1}, step {step}: {self.stop_requested}")
                break

    def _train_step(self, batches, step: int) -> None:
        k = self.options.grad_accum
        model, optimizer, precision = self.wrapped.model, self.wrapped.optimizer, self.wrapped.precision
        # Gradients are dropped here, while the forward pass is about to allocate: dropping them right after
        # optimizer.step() left the heap top free, glibc returned it to the OS and every step paid for page
        # faults again (zero_grad took 2.7 ms instead of 0.1 ms, 15% of a LeNet step on CPU).
        optimizer.zero_grad(set_to_none=True)
        losses = []
        beat = self.heartbeat.beat
        for micro in range(k):
            beat(step, "data")
            fetch_start = time.perf_counter()
            batch = next(batches)
            self.meter.add_data_time(time.perf_counter() - fetch_start)
            beat(step, "compute")
            with self.strategy.sync(model, on=micro == k - 1):
                with precision.autocast():
                    out = self.data.step(model, batch, self.data.loss)
                per_sample = per_sample_losses(out.loss, out.samples)
                precision.backward(per_sample.mean() / k)
            losses.append(per_sample.detach())
        self.lr_schedule.apply(optimizer, step)
        skip_nonfinite = self.options.on_nonfinite == "skip"
        stepped = precision.optimizer_step(model, optimizer, self.options.grad_clip, skip_nonfinite)
        beat(step, "step_end")
        if not stepped:
            self.totals.skipped_steps += 1
            self.say(f"step {step}: non-finite loss or gradient, step skipped (trainer.on_nonfinite=skip)")
            self.meter.add_step(step)
            return
        for per_sample in losses:
            self.meter.add_micro_batch(per_sample)
        self.meter.add_step(step)

    def _log(self, step: int) -> None:
        self.heartbeat.beat(step, "log")
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

    def _evaluate(self, step: int) -> None:
        self.callbacks.on_evaluation_start(self, step)
        result = evaluate(self.strategy, self.wrapped, self.data,
                          on_batch=lambda: self.heartbeat.beat(step, "evaluate"))
        if self.is_main:
            self.totals.val_loss, self.totals.val_metrics = result.loss, result.metrics
        self.callbacks.on_evaluation_end(self, step, result if self.is_main else None)


@torch.no_grad()
def evaluate(strategy: Strategy, wrapped: Wrapped, data: LoopData, on_batch=None) -> EvalResult:
    """The test split through the step on every rank (each its share), the metrics over all of it: every rank gets
    the same result. The training loop's evaluation, and eval.py's."""
    model = strategy.eval_model(wrapped.model)
    model.eval()
    metrics = EvalMetrics(data.metrics, strategy)
    for batch in data.eval_batches():
        if on_batch is not None:
            on_batch()
        with wrapped.precision.autocast():
            out = data.step(model, batch, data.loss)
        metrics.update(per_sample_losses(out.loss, out.samples), out.outputs, out.targets)
    loss, values = metrics.compute()
    return EvalResult(loss, values)
