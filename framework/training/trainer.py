"""The one training loop, shared by every strategy. Strategy-specific work is behind Strategy's methods."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch

from framework.checkpoints.position import Position, resume_point
from framework.training.interrupts import Interrupted
from framework.training.lr_schedule import LrSchedule
from framework.telemetry.meters import COLUMNS, FIRST_NONFINITE, IntervalMeter, IntervalSummary
from framework.training.metrics import per_sample_losses
from framework.training.precision import Precision
from framework.telemetry.progress import Progress


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

    def add(self, s: IntervalSummary, rows: torch.Tensor) -> None:
        self.samples += s.samples
        self.seconds += s.seconds
        slot_samples, slot_seconds = rows[:, 0].tolist(), rows[:, 1].tolist()
        if len(self.slot_samples) != len(slot_samples):
            self.slot_samples, self.slot_seconds = [0.0] * len(slot_samples), [0.0] * len(slot_samples)
        if len(self.slot_max_mem_gib) != len(slot_samples):
            self.slot_max_mem_gib = [0.0] * len(slot_samples)
        for i, (n, sec) in enumerate(zip(slot_samples, slot_seconds)):
            self.slot_samples[i] += n
            self.slot_seconds[i] += sec
            self.slot_max_mem_gib[i] = max(self.slot_max_mem_gib[i], s.per_slot_max_mem_gib[i])
        self.train_loss = s.loss

    def per_slot_samples_per_sec(self) -> list[float]:
        return [n / s if s > 0 else 0.0 for n, s in zip(self.slot_samples, self.slot_seconds)]


class Trainer:
    def __init__(self, cfg, strategy, model, optimizer, train_loader, micro_batch: int, eval_batches,
                 precision: Precision, tb, say, checkpointer, faults, stop, loss, metrics: dict, per_gpu=None):
        self.cfg, self.t = cfg, cfg.trainer
        self.strategy, self.model, self.optimizer = strategy, model, optimizer
        self.train_loader, self.eval_batches = train_loader, eval_batches
        self.precision, self.tb, self.say = precision, tb, say
        self.checkpointer, self.faults, self.stop = checkpointer, faults, stop
        self.loss, self.metrics = loss, metrics
        self.per_gpu = per_gpu  # framework/telemetry/per_gpu.py: FLOP/s, MFU and stragglers (None: not reported)
        self.totals = RunTotals()
        self.steps_per_epoch = len(train_loader) // self.t.grad_accum
        if self.steps_per_epoch < 1:
            raise ValueError("the training split is smaller than one global batch")
        planned = self.t.epochs * self.steps_per_epoch
        self.total_steps = min(self.t.max_steps, planned) if self.t.max_steps else planned
        self.epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        self.lr_schedule = LrSchedule(cfg.lr_schedule, self.total_steps)
        self.lr_schedule.attach(optimizer)
        self.skip_nonfinite = self.t.on_nonfinite == "skip"
        memory_devices = [torch.device("cuda", i) for i in strategy.cuda_devices()]
        slot_sizes = strategy.slot_sizes(micro_batch)
        self.meter = IntervalMeter(slot_sizes, strategy.device, memory_devices, strategy.wait_clock)
        caveat = getattr(strategy.wait_clock, "caveat", None)
        if caveat and len(slot_sizes) > 1 and strategy.is_main:
            say(f"note: {caveat}")

    def restore_totals(self, totals: dict) -> None:
        if totals:
            self.totals = RunTotals(**totals)

    def fit(self, start: Position = Position()) -> RunTotals:
        """Train from `start` (framework/checkpoints/position.py: why the data position is counted in samples, and
        how a run on another world size or batch continues the epoch without a sample twice or skipped)."""
        k, batch = self.t.grad_accum, self.t.batch_size
        resumed = resume_point(start, batch, self.steps_per_epoch)
        step = resumed.step
        self.meter.reset()  # the time since __init__ (a checkpoint being loaded) is not training time
        for epoch in range(resumed.epoch, self.epochs):
            first = resumed.steps_in_epoch if epoch == resumed.epoch else 0
            last = min(self.steps_per_epoch, first + self.total_steps - step)
            self.model.train()
            self.train_loader.set_epoch(epoch)
            batches = self.train_loader.iterate(first * k)
            for batch_in_epoch in range(first + 1, last + 1):
                step += 1
                self._train_step(batches, step)
                self.faults.kill_if_due("kill_after_step", step)
                epoch_end = batch_in_epoch == self.steps_per_epoch or step == self.total_steps
                stopping = self.stop.requested  # read once: a signal may land anywhere below
                checkpoint_due = stopping or self.checkpointer.due(step, epoch_end)
                if step % self.t.log_every_n_steps == 0 or checkpoint_due:
                    self._log(step, epoch)
                if checkpoint_due:
                    self.checkpointer.save(self.model, self.optimizer, self.precision.scaler,
                                           Position(step, epoch, batch_in_epoch * batch, batch), asdict(self.totals),
                                           self.tb)
                if stopping:
                    raise Interrupted(self.stop.signum)
            if self.meter.steps:
                self._log(step, epoch)
            if (epoch + 1) % self.t.eval_every_n_epochs == 0 or epoch == self.epochs - 1:
                self._evaluate(step, epoch)
            self.meter.reset()  # evaluation time is not training time
        return self.totals

    def _train_step(self, batches, step: int) -> None:
        k = self.t.grad_accum
        # Gradients are dropped here, while the forward pass is about to allocate: dropping them right after
        # optimizer.step() left the heap top free, glibc returned it to the OS and every step paid for page
        # faults again (zero_grad took 2.7 ms instead of 0.1 ms, 15% of a LeNet step on CPU).
        self.optimizer.zero_grad(set_to_none=True)
        self.faults.slow_down()  # HYDRA_DIST_FAULT=slow_rank only
        losses = []
        for micro in range(k):
            fetch_start = time.perf_counter()
            x, y = next(batches)
            self.meter.add_data_time(time.perf_counter() - fetch_start)
            with self.strategy.sync(self.model, on=micro == k - 1):
                with self.precision.autocast():
                    logits = self.model(x)
                per_sample = per_sample_losses(self.loss, logits.float(), y)
                if self.faults.due("nan_loss", step):
                    per_sample = per_sample * float("nan")
                self.precision.backward(per_sample.mean() / k)
            losses.append(per_sample)
        self.lr_schedule.apply(self.optimizer, step)
        if not self.precision.optimizer_step(self.model, self.optimizer, self.t.grad_clip, self.skip_nonfinite):
            self.totals.skipped_steps += 1
            self.say(f"step {step}: non-finite loss or gradient, step skipped (trainer.on_nonfinite=skip)")
            self.meter.add_step(step)
            return
        for per_sample in losses:
            self.meter.add_micro_batch(per_sample)
        self.meter.add_step(step)

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _log(self, step: int, epoch: int) -> None:
        rows = self.meter.rows(self.strategy.optimizer_state_bytes(self.optimizer))
        rows = self.strategy.all_gather(rows).reshape(-1, len(COLUMNS)).cpu()
        self.meter.reset()
        self._stop_if_nonfinite(rows)
        if not self.strategy.is_main:
            return
        s = IntervalSummary.from_rows(rows)
        self.totals.add(s, rows)
        if self.tb:
            self.tb.log_interval(step, s, self._lr())
        self._log_per_gpu(step, s)
        per_rank = ", ".join(f"{r:,.0f}" for r in s.per_slot_samples_per_sec)
        data_share = 100 * s.data_ms / s.step_ms if s.step_ms else 0.0
        self.say(
            f"epoch {epoch + 1}/{self.epochs} step {step}/{self.total_steps} | loss {s.loss:.4f} | "
            f"{s.samples_per_sec:,.0f} samples/s (per rank: {per_rank}) | data {data_share:.0f}% of step",
            progress=Progress(step, self.total_steps, epoch + 1, self.epochs, s.loss, s.samples_per_sec,
                              s.samples_per_sec / self.t.batch_size),
        )

    def _log_per_gpu(self, step: int, s: IntervalSummary) -> None:
        if self.per_gpu is None:
            return
        stragglers = [(g.rank, g.ratio, g.line(step, self.per_gpu.threshold)) for g in self.per_gpu.stragglers(s)]
        for _, _, line in stragglers:
            self.say(line)
        if self.tb:
            tflops = self.per_gpu.tflops(s)
            self.tb.log_per_gpu(step, s, tflops, self.per_gpu.mfu(tflops), stragglers)

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
    def _evaluate(self, step: int, epoch: int) -> None:
        model = self.strategy.eval_model(self.model)
        model.eval()
        names = list(self.metrics)
        # count, loss sum, then each metric's sum of per-sample scores
        sums = torch.zeros(2 + len(names), device=self.strategy.device, dtype=torch.float64)
        for i, (x, y) in enumerate(self.eval_batches()):
            if i == 0:
                self.faults.kill_if_due("kill_in_eval", step)
            with self.precision.autocast():
                logits = model(x).float()
            sums[0] += len(y)
            sums[1] += per_sample_losses(self.loss, logits, y).sum()
            for j, name in enumerate(names):
                sums[2 + j] += self.metrics[name](logits, y)
        count, loss_sum, *metric_sums = self.strategy.all_reduce_sum(sums).tolist()
        if not self.strategy.is_main:
            return
        count = max(count, 1)
        self.totals.val_loss = loss_sum / count
        self.totals.val_metrics = {name: total / count for name, total in zip(names, metric_sums)}
        if self.tb:
            self.tb.log_eval(step, self.totals.val_loss, self.totals.val_metrics)
        shown = "".join(f" | test {'accuracy' if name == 'acc' else name} {value:.4f}"
                        for name, value in self.totals.val_metrics.items())
        self.say(f"epoch {epoch + 1}/{self.epochs} test loss {self.totals.val_loss:.4f}{shown}")
