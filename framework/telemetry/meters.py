"""Per-slot training meters kept on the device between log boundaries: adding a step never syncs.

A slot is one GPU's share (a ddp rank, or a dp replica). At a log boundary every process
contributes one row per slot; rows are gathered in rank order, so row r is `rank{r}` in TensorBoard.

Model parallel peers (tensor, pipeline) train the same samples together: each counts its `share` of them (1 / the
peers), so the rows add up to the samples trained, each rank's FLOP/s is its own share of the model's, and the loss
(a mean over the same samples on every peer) is unchanged.

Each process times its own window, from its reset to its rows(), and the ranks do not reach a boundary at the same
moment (pipeline stages of a 70-100 ms step: 0.3-2 ms apart on an idle machine, either one first; a loaded core
widens it). Every rate is over the interval's wall time, the longest of those windows: a rank's samples/s is its
samples over the time the job took for them, so the ranks' rates add up to the job's exactly. Only busy (a rank's
own work) is out of its own window.

The frame is what every rate and the loop's stop need: samples, seconds and steps (every rate, and every meter's
summary, is over them), the per-slot loss sums (a non-finite one stops the loop), the first non-finite and the skipped
steps (an interval of skipped steps has no rates). Every other number is a meter (framework/telemetry/meter.py),
registered in meter_registry.py or by a mode at assembly; a meter's `loss/train` (the invariant mode's) is the
interval's loss, and each rank's own still makes loss/train/rank{r}.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from framework.telemetry.meter import Interval, MeterSources, StepRecord
from framework.telemetry.meter_registry import METERS

FRAME = ("samples", "seconds", "loss_sum", "steps", "first_nonfinite_step", "skipped_steps")


def columns_of(meters=METERS) -> tuple[str, ...]:
    """The gathered rows' column names: the frame's, then each meter's."""
    return FRAME + tuple(column for meter in meters for column in meter.columns)


COLUMNS = columns_of()  # with the registered meters


class IntervalMeter:
    def __init__(self, sources: MeterSources, meters: tuple = METERS):
        """meters: the registered ones (meter_registry.py), and a mode's own where assembly adds them."""
        self.sources, self.slot_sizes, self.device = sources, sources.slot_sizes, sources.device
        self.traffic = sources.traffic  # what the run's result calls its compression (framework/worker.py)
        self.kinds, self.columns = tuple(meters), columns_of(meters)
        self.meters = [meter(sources) for meter in self.kinds]
        self.loss_sum = torch.zeros(len(self.slot_sizes), device=self.device, dtype=torch.float64)
        self.first_nonfinite = torch.zeros((), device=self.device, dtype=torch.float64)
        self.reset()

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.first_nonfinite.zero_()
        self.samples = 0
        self.steps = 0
        self.skipped_steps = 0  # trainer.on_nonfinite=skip: steps whose optimizer step was skipped (no loss, no samples)
        for meter in self.meters:
            meter.reset()
        self.start = time.perf_counter()

    def add(self, record: StepRecord) -> None:
        """One optimizer step, into the frame and every meter."""
        for per_sample_loss in record.losses:
            self._add_micro_batch(per_sample_loss)
        self.steps += 1
        self.skipped_steps += record.skipped
        for meter in self.meters:
            meter.add(record)
        # A NaN/inf loss makes the interval's sum non-finite for good; remember the step where that happened.
        # Three tiny device ops and no sync: the check itself happens at the log boundary.
        already = (self.first_nonfinite > 0) | torch.isfinite(self.loss_sum.sum())
        self.first_nonfinite = torch.where(already, self.first_nonfinite, float(record.step))

    def _add_micro_batch(self, per_sample_loss: torch.Tensor) -> None:
        if len(self.slot_sizes) == 1:
            self.loss_sum += per_sample_loss.detach().sum() * self.sources.share
        else:  # a stream's short micro-batch is scattered as DataParallel does it: in even chunks
            loss = per_sample_loss.detach()
            chunks = loss.split(self.slot_sizes) if loss.numel() == sum(self.slot_sizes) else \
                loss.chunk(len(self.slot_sizes))
            sums = [c.sum() for c in chunks] + [loss.new_zeros(())] * (len(self.slot_sizes) - len(chunks))
            self.loss_sum += torch.stack(sums)
        self.samples += per_sample_loss.numel() * self.sources.share

    def rows(self) -> torch.Tensor:
        """One row per local slot (see `columns`). Synchronizes each of this process's GPUs once, so seconds are real
        and every CUDA event the clocks recorded (dp: on each replica's own GPU) can be read."""
        if self.device.type == "cuda":
            for dev in self.sources.cuda_devices or [self.device]:
                torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - self.start
        micro_batches = self.samples / max(1, sum(self.slot_sizes))
        samples = torch.tensor(self.slot_sizes, dtype=torch.float64, device=self.device) * micro_batches
        frame = {"samples": samples, "seconds": seconds, "loss_sum": self.loss_sum, "steps": self.steps,
                 "first_nonfinite_step": self.first_nonfinite, "skipped_steps": self.skipped_steps}
        rows = torch.stack([torch.as_tensor(frame[name], dtype=torch.float64, device=self.device).expand(len(samples))
                            for name in FRAME], dim=1)
        return torch.cat([rows, *(meter.rows().to(self.device) for meter in self.meters)], dim=1)


@dataclass(kw_only=True)
class IntervalSummary:
    """What one log boundary reports, computed on rank 0 from the gathered rows: the frame's numbers, the meters'
    tags, and every slot's columns by name (what the run's totals read)."""

    steps: int
    samples: float
    seconds: float
    loss: float
    per_slot_samples_per_sec: list[float]
    per_slot_loss: list[float]
    step_ms: float
    per_slot_samples: list[float]
    # per optimizer step: the rank's own work (data, forward, backward, optimizer) and its waits for the others;
    # the wait is NaN where the strategy cannot measure it (busy is then the whole step)
    per_slot_busy_ms: list[float]
    per_slot_wait_ms: list[float]
    # trainer.on_nonfinite=skip: the steps whose optimizer step was skipped (their samples and loss are not counted)
    skipped_steps: int = 0
    tags: dict[str, float] = field(default_factory=dict)  # the meters' (framework/telemetry/meter.py)
    columns: dict[str, list[float]] = field(default_factory=dict)  # every slot's, by name

    @property
    def trained(self) -> bool:
        """Whether any step of the interval trained: an interval of skipped steps has no loss and no throughput."""
        return self.steps > self.skipped_steps

    @property
    def samples_per_sec(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @staticmethod
    def from_rows(rows: torch.Tensor, meters: tuple = METERS) -> "IntervalSummary":
        """rows: every slot's, gathered; meters: the IntervalMeter's that made them (its `kinds`)."""
        rows = rows.double().cpu()
        column = dict(zip(columns_of(meters), rows.unbind(1), strict=True))  # rows made by other meters: ValueError
        samples = column["samples"]
        seconds = column["seconds"].clamp_min(1e-12)  # each slot's own window
        interval = seconds.max()  # the interval's wall time: every rate is over it, so the slots add up to the job
        steps, skipped = int(column["steps"][0]), int(column["skipped_steps"][0])
        wait, comm = column["wait_seconds"], column["comm_seconds"]
        busy = (seconds - wait.nan_to_num(0.0) - comm.nan_to_num(0.0)).clamp_min(1e-12)
        named = Interval(column, steps, float(interval), steps > skipped)
        tags = {tag: value for meter in meters for tag, value in meter.summary(named).items()}
        return IntervalSummary(
            steps=steps, samples=float(samples.sum()), seconds=float(interval), skipped_steps=skipped, tags=tags,
            loss=tags.get("loss/train", float(column["loss_sum"].sum() / samples.sum().clamp_min(1))),
            per_slot_samples_per_sec=(samples / interval).tolist(), per_slot_samples=samples.tolist(),
            per_slot_loss=(column["loss_sum"] / samples.clamp_min(1)).tolist(),
            step_ms=float(seconds.mean()) * 1000 / max(1, steps),
            per_slot_busy_ms=(busy * 1000 / max(1, steps)).tolist(),
            per_slot_wait_ms=(wait * 1000 / max(1, steps)).tolist(),
            columns={name: values.tolist() for name, values in column.items()})
