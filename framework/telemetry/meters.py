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

The frame is the interval itself: samples, seconds, steps, data time, the loss, memory, the skipped and non-finite
steps (what every rate and the loop's stop need). Every other number is a meter (framework/telemetry/meter.py),
registered in framework/telemetry/meter_registry.py: the frame resets it, hands it each step, puts its columns after
its own, and IntervalSummary asks it for its tags.
"""
from __future__ import annotations

import math
import time
import dataclasses
from dataclasses import dataclass

import torch

from framework.telemetry.meter import Interval, MeterSources, StepRecord
from framework.telemetry.meter_registry import METERS

FRAME = ("samples", "seconds", "loss_sum", "steps", "data_seconds", "max_mem_gib", "first_nonfinite_step",
         "optimizer_state_mib", "max_reserved_gib", "skipped_steps", "global_loss_sum")
COLUMNS = FRAME + tuple(column for meter in METERS for column in meter.columns)
(SAMPLES, SECONDS, LOSS_SUM, STEPS, DATA_SECONDS, MAX_MEM, FIRST_NONFINITE, OPTIMIZER_STATE, MAX_RESERVED,
 SKIPPED_STEPS, GLOBAL_LOSS_SUM) = range(len(FRAME))
# the meters' columns some tests and the run's totals read by position
TOKENS, WAIT_SECONDS, COMM_SECONDS, BYTES_SENT, BYTES_UNCOMPRESSED, COMPRESSED_STEPS = (COLUMNS.index(c) for c in (
    "tokens", "wait_seconds", "comm_seconds", "bytes_sent", "bytes_uncompressed", "compressed_steps"))


class IntervalMeter:
    def __init__(self, slot_sizes: list[int], device: torch.device, memory_devices: list[torch.device],
                 wait_clock=None, share: float = 1.0, traffic=None):
        self.slot_sizes = slot_sizes
        self.share = share  # of each sample this process counts (model parallel peers share their samples)
        self.device = device
        self.memory_devices = memory_devices
        # framework/training/instrument.py: the engine's wait clock (WaitMeter reads it); traffic.py: its gradient
        # bytes (GradientBytesMeter); None where the engine has none
        self.wait_clock = wait_clock
        self.traffic = traffic  # what the run's result calls its compression (framework/worker.py)
        sources = MeterSources(slot_sizes, device, share, wait_clock, traffic)
        self.meters = [meter(sources) for meter in METERS]
        self.loss_sum = torch.zeros(len(slot_sizes), device=device, dtype=torch.float64)
        self.first_nonfinite = torch.zeros((), device=device, dtype=torch.float64)
        # the loss summed over every rank's samples, the same on every rank (trainer.invariant)
        self.global_loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        self.counts_global_loss = False
        self.reset()

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.first_nonfinite.zero_()
        self.global_loss_sum.zero_()
        self.samples = 0
        self.steps = 0
        self.skipped_steps = 0  # trainer.on_nonfinite=skip: steps whose optimizer step was skipped (no loss, no samples)
        self.data_seconds = 0.0
        for dev in self.memory_devices:  # peaks are per interval: evaluation's peak must not show in training's
            torch.cuda.reset_peak_memory_stats(dev)
        for meter in self.meters:
            meter.reset()
        self.start = time.perf_counter()

    def add(self, record: StepRecord) -> None:
        """One optimizer step, into the frame and every meter."""
        for per_sample_loss in record.losses:
            self._add_micro_batch(per_sample_loss)
        if record.global_loss is not None:
            # the step's loss over every rank's samples in an order that does not depend on the ranks
            # (trainer.invariant): the interval's loss is taken from it, so it is bitwise the same on any world size;
            # each rank's own still makes loss/train/rank{r}
            self.counts_global_loss = True
            self.global_loss_sum += record.global_loss
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
            self.loss_sum += per_sample_loss.detach().sum() * self.share
        else:  # a stream's short micro-batch is scattered as DataParallel does it: in even chunks
            loss = per_sample_loss.detach()
            chunks = loss.split(self.slot_sizes) if loss.numel() == sum(self.slot_sizes) else \
                loss.chunk(len(self.slot_sizes))
            sums = [c.sum() for c in chunks] + [loss.new_zeros(())] * (len(self.slot_sizes) - len(chunks))
            self.loss_sum += torch.stack(sums)
        self.samples += per_sample_loss.numel() * self.share

    def add_data_time(self, seconds: float) -> None:
        self.data_seconds += seconds

    def rows(self, optimizer_state_bytes: int = 0) -> torch.Tensor:
        """One row per local slot (see COLUMNS). Synchronizes each of this process's GPUs once, so seconds are real
        and every CUDA event the clocks recorded (dp: on each replica's own GPU) can be read.
        The optimizer state is this process's; it goes into its first slot (dp replicas hold none)."""
        if self.device.type == "cuda":
            for dev in self.memory_devices or [self.device]:
                torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - self.start
        n = len(self.slot_sizes)
        rows = torch.zeros(n, len(FRAME), dtype=torch.float64)
        micro_batches = self.samples / max(1, sum(self.slot_sizes))
        rows[:, SAMPLES] = torch.tensor(self.slot_sizes, dtype=torch.float64) * micro_batches
        rows[:, SECONDS] = seconds
        rows[:, STEPS] = self.steps
        rows[:, SKIPPED_STEPS] = self.skipped_steps
        rows[:, DATA_SECONDS] = self.data_seconds
        rows[0, OPTIMIZER_STATE] = optimizer_state_bytes / 2**20
        for i, dev in enumerate(self.memory_devices[:n]):
            rows[i, MAX_MEM] = torch.cuda.max_memory_allocated(dev) / 2**30
            rows[i, MAX_RESERVED] = torch.cuda.max_memory_reserved(dev) / 2**30
        rows = rows.to(self.device)
        rows[:, LOSS_SUM] = self.loss_sum
        rows[:, FIRST_NONFINITE] = self.first_nonfinite
        rows[:, GLOBAL_LOSS_SUM] = self.global_loss_sum if self.counts_global_loss else math.nan
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
    per_slot_max_mem_gib: list[float]
    per_slot_max_reserved_gib: list[float]
    per_slot_optimizer_state_mib: list[float]
    step_ms: float
    data_ms: float
    per_slot_samples: list[float]
    per_slot_seconds: list[float]  # each slot's own window (rates are over `seconds`, the longest)
    # per optimizer step: the rank's own work (data, forward, backward, optimizer) and its waits for the others;
    # the wait is NaN where the strategy cannot measure it (busy is then the whole step)
    per_slot_busy_ms: list[float]
    per_slot_wait_ms: list[float]
    # trainer.on_nonfinite=skip: the interval's steps whose optimizer step was skipped (their samples and loss are
    # not counted)
    skipped_steps: int = 0
    tags: dict[str, float] = dataclasses.field(default_factory=dict)  # the meters' (framework/telemetry/meter.py)
    columns: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # every slot's, by COLUMNS' names

    @property
    def trained(self) -> bool:
        """Whether any step of the interval trained: an interval of skipped steps has no loss and no throughput."""
        return self.steps > self.skipped_steps

    @property
    def samples_per_sec(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @staticmethod
    def from_rows(rows: torch.Tensor) -> "IntervalSummary":
        rows = rows.double().cpu()
        samples = rows[:, SAMPLES]
        seconds = rows[:, SECONDS].clamp_min(1e-12)  # each slot's own window
        interval = seconds.max()  # the interval's wall time: every rate is over it, so the slots add up to the job
        steps = int(rows[0, STEPS])
        wait, comm = rows[:, WAIT_SECONDS], rows[:, COMM_SECONDS]
        busy = (seconds - wait.nan_to_num(0.0) - comm.nan_to_num(0.0)).clamp_min(1e-12)
        skipped = int(rows[0, SKIPPED_STEPS])
        named = Interval({name: rows[:, i] for i, name in enumerate(COLUMNS)}, steps, float(interval), steps > skipped)
        return IntervalSummary(
            steps=steps,
            samples=float(samples.sum()),
            seconds=float(interval),
            loss=float((rows[:, LOSS_SUM].sum() if rows[0, GLOBAL_LOSS_SUM].isnan() else rows[0, GLOBAL_LOSS_SUM])
                       / samples.sum().clamp_min(1)),
            per_slot_samples_per_sec=(samples / interval).tolist(),
            per_slot_loss=(rows[:, LOSS_SUM] / samples.clamp_min(1)).tolist(),
            per_slot_max_mem_gib=rows[:, MAX_MEM].tolist(),
            per_slot_max_reserved_gib=rows[:, MAX_RESERVED].tolist(),
            per_slot_optimizer_state_mib=rows[:, OPTIMIZER_STATE].tolist(),
            step_ms=float(seconds.mean()) * 1000 / max(1, steps),
            data_ms=float(rows[:, DATA_SECONDS].mean()) * 1000 / max(1, steps),
            per_slot_samples=samples.tolist(),
            per_slot_seconds=seconds.tolist(),
            per_slot_busy_ms=(busy * 1000 / max(1, steps)).tolist(),
            per_slot_wait_ms=(wait * 1000 / max(1, steps)).tolist(),
            skipped_steps=skipped,
            tags={tag: value for meter in METERS for tag, value in meter.summary(named).items()},
            columns={name: column.tolist() for name, column in named.columns.items()},
        )
