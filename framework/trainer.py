"""The one training loop, shared by every strategy. Strategy-specific work is behind Strategy's methods."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from framework.meters import COLUMNS, IntervalMeter, IntervalSummary
from framework.precision import Precision


@dataclass
class RunTotals:
    """Rank 0's running totals over every logged interval."""

    samples: float = 0.0
    seconds: float = 0.0
    slot_samples: list[float] = field(default_factory=list)
    slot_seconds: list[float] = field(default_factory=list)
    train_loss: float = math.nan
    val_loss: float = math.nan
    val_acc: float = math.nan

    def add(self, s: IntervalSummary, rows: torch.Tensor) -> None:
        self.samples += s.samples
        self.seconds += s.seconds
        slot_samples, slot_seconds = rows[:, 0].tolist(), rows[:, 1].tolist()
        if not self.slot_samples:
            self.slot_samples, self.slot_seconds = [0.0] * len(slot_samples), [0.0] * len(slot_samples)
        for i, (n, sec) in enumerate(zip(slot_samples, slot_seconds)):
            self.slot_samples[i] += n
            self.slot_seconds[i] += sec
        self.train_loss = s.loss

    def per_slot_samples_per_sec(self) -> list[float]:
        return [n / s if s > 0 else 0.0 for n, s in zip(self.slot_samples, self.slot_seconds)]


class Trainer:
    def __init__(self, cfg, strategy, model, optimizer, train_loader, micro_batch: int, eval_batches,
                 precision: Precision, tb, say):
        self.cfg, self.t = cfg, cfg.trainer
        self.strategy, self.model, self.optimizer = strategy, model, optimizer
        self.train_loader, self.eval_batches = train_loader, eval_batches
        self.precision, self.tb, self.say = precision, tb, say
        self.totals = RunTotals()
        self.steps_per_epoch = len(train_loader) // self.t.grad_accum
        if self.steps_per_epoch < 1:
            raise ValueError("the training split is smaller than one global batch")
        planned = self.t.epochs * self.steps_per_epoch
        self.total_steps = min(self.t.max_steps, planned) if self.t.max_steps else planned
        self.epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        device = strategy.device
        memory_devices = [torch.device("cuda", i) for i in getattr(strategy, "device_ids", [])] or (
            [device] if device.type == "cuda" else [])
        self.meter = IntervalMeter(strategy.slot_sizes(micro_batch), device, memory_devices)

    def fit(self) -> RunTotals:
        step, k = 0, self.t.grad_accum
        for epoch in range(self.epochs):
            self.model.train()
            self.train_loader.set_epoch(epoch)
            batches = iter(self.train_loader)
            for _ in range(min(self.steps_per_epoch, self.total_steps - step)):
                for micro in range(k):
                    fetch_start = time.perf_counter()
                    x, y = next(batches)
                    self.meter.add_data_time(time.perf_counter() - fetch_start)
                    with self.strategy.sync(self.model, on=micro == k - 1):
                        with self.precision.autocast():
                            logits = self.model(x)
                        per_sample = F.cross_entropy(logits.float(), y, reduction="none")
                        self.precision.backward(per_sample.mean() / k)
                    self.meter.add_micro_batch(per_sample)
                if self.t.grad_clip:
                    self.precision.unscale(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.t.grad_clip)
                self.precision.step(self.optimizer)
                self.optimizer.zero_grad(set_to_none=True)
                step += 1
                self.meter.add_step()
                if step % self.t.log_every_n_steps == 0:
                    self._log(step, epoch)
            if self.meter.steps:
                self._log(step, epoch)
            if (epoch + 1) % self.t.eval_every_n_epochs == 0 or epoch == self.epochs - 1:
                self._evaluate(step, epoch)
            self.meter.reset()  # evaluation time is not training time
        return self.totals

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _log(self, step: int, epoch: int) -> None:
        rows = self.strategy.all_gather(self.meter.rows()).reshape(-1, len(COLUMNS)).cpu()
        self.meter.reset()
        if not self.strategy.is_main:
            return
        s = IntervalSummary.from_rows(rows)
        self.totals.add(s, rows)
        if self.tb:
            self.tb.log_interval(step, s, self._lr())
        per_rank = ", ".join(f"{r:,.0f}" for r in s.per_slot_samples_per_sec)
        data_share = 100 * s.data_ms / s.step_ms if s.step_ms else 0.0
        self.say(
            f"epoch {epoch + 1}/{self.epochs} step {step}/{self.total_steps} | loss {s.loss:.4f} | "
            f"{s.samples_per_sec:,.0f} samples/s (per rank: {per_rank}) | data {data_share:.0f}% of step"
        )

    @torch.no_grad()
    def _evaluate(self, step: int, epoch: int) -> None:
        model = self.strategy.eval_model(self.model)
        model.eval()
        sums = torch.zeros(3, device=self.strategy.device, dtype=torch.float64)  # loss sum, correct, count
        for x, y in self.eval_batches():
            with self.precision.autocast():
                logits = model(x)
            sums[0] += F.cross_entropy(logits.float(), y, reduction="sum")
            sums[1] += (logits.argmax(1) == y).sum()
            sums[2] += len(y)
        loss_sum, correct, count = self.strategy.all_reduce_sum(sums).tolist()
        if not self.strategy.is_main:
            return
        self.totals.val_loss, self.totals.val_acc = loss_sum / max(count, 1), correct / max(count, 1)
        if self.tb:
            self.tb.log_eval(step, self.totals.val_loss, self.totals.val_acc)
        self.say(f"epoch {epoch + 1}/{self.epochs} test loss {self.totals.val_loss:.4f} | test accuracy {self.totals.val_acc:.4f}")
