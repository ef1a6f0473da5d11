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
"""
from __future__ import annotations

import math
import time
import dataclasses
from dataclasses import dataclass

import torch

COLUMNS = ("samples", "seconds", "loss_sum", "steps", "data_seconds", "max_mem_gib", "first_nonfinite_step",
           "optimizer_state_mib", "max_reserved_gib", "wait_seconds", "forward_seconds", "backward_seconds", "tokens",
           "comm_seconds", "bytes_sent", "bytes_uncompressed", "compressed_steps", "skipped_steps", "global_loss_sum")
(SAMPLES, SECONDS, LOSS_SUM, STEPS, DATA_SECONDS, MAX_MEM, FIRST_NONFINITE, OPTIMIZER_STATE,
 MAX_RESERVED, WAIT_SECONDS, FORWARD_SECONDS, BACKWARD_SECONDS, TOKENS, COMM_SECONDS, BYTES_SENT, BYTES_UNCOMPRESSED,
 COMPRESSED_STEPS, SKIPPED_STEPS, GLOBAL_LOSS_SUM) = range(len(COLUMNS))


class IntervalMeter:
    def __init__(self, slot_sizes: list[int], device: torch.device, memory_devices: list[torch.device],
                 wait_clock=None, share: float = 1.0, traffic=None):
        self.slot_sizes = slot_sizes
        self.share = share  # of each sample this process counts (model parallel peers share their samples)
        self.device = device
        self.memory_devices = memory_devices
        # framework/telemetry/wait_clock.py (one wait per process) or replica_clock.py (dp: one per replica, and each replica's
        # forward and backward); None: this strategy's waits are not measured
        self.wait_clock = wait_clock
        # framework/telemetry/traffic.py: the gradient bytes this process handed to its collectives; None: not counted
        self.traffic = traffic
        self.loss_sum = torch.zeros(len(slot_sizes), device=device, dtype=torch.float64)
        self.tokens = torch.zeros(len(slot_sizes), device=device, dtype=torch.float64)
        self.token_shares = torch.tensor(slot_sizes, device=device, dtype=torch.float64) / max(1, sum(slot_sizes))
        self.counts_tokens = False  # whether the step says what a token is (StepOutput.tokens)
        self.first_nonfinite = torch.zeros((), device=device, dtype=torch.float64)
        # the loss summed over every rank's samples, the same on every rank (trainer.invariant: add_global_loss)
        self.global_loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        self.counts_global_loss = False
        self.reset()

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.tokens.zero_()
        self.first_nonfinite.zero_()
        self.global_loss_sum.zero_()
        self.samples = 0
        self.steps = 0
        self.skipped_steps = 0  # trainer.on_nonfinite=skip: steps whose optimizer step was skipped (no loss, no samples)
        self.data_seconds = 0.0
        for dev in self.memory_devices:  # peaks are per interval: evaluation's peak must not show in training's
            torch.cuda.reset_peak_memory_stats(dev)
        if self.wait_clock:
            self.wait_clock.reset()
        if self.traffic:
            self.traffic.reset()
        self.start = time.perf_counter()

    def add_micro_batch(self, per_sample_loss: torch.Tensor) -> None:
        if len(self.slot_sizes) == 1:
            self.loss_sum += per_sample_loss.detach().sum() * self.share
        else:  # a stream's short micro-batch is scattered as DataParallel does it: in even chunks
            loss = per_sample_loss.detach()
            chunks = loss.split(self.slot_sizes) if loss.numel() == sum(self.slot_sizes) else \
                loss.chunk(len(self.slot_sizes))
            sums = [c.sum() for c in chunks] + [loss.new_zeros(())] * (len(self.slot_sizes) - len(chunks))
            self.loss_sum += torch.stack(sums)
        self.samples += per_sample_loss.numel() * self.share

    def add_global_loss(self, loss_sum: torch.Tensor) -> None:
        """A step's loss summed over every rank's samples in an order that does not depend on the ranks
        (trainer.invariant): the interval's loss is taken from it, so it is bitwise the same on any world size; each
        rank's own (add_micro_batch) still makes loss/train/rank{r}."""
        self.counts_global_loss = True
        self.global_loss_sum += loss_sum

    def add_tokens(self, count) -> None:
        """A micro-batch's tokens (a number or a tensor on the device: no sync), shared by its slots by their size
        (dp: the step sees the whole process's batch)."""
        self.counts_tokens = True
        self.tokens += self.token_shares * (count * self.share)

    def add_data_time(self, seconds: float) -> None:
        self.data_seconds += seconds

    def add_step(self, step: int, skipped: bool = False) -> None:
        self.steps += 1
        self.skipped_steps += skipped
        if self.traffic:
            self.traffic.end_step()
        # A NaN/inf loss makes the interval's sum non-finite for good; remember the step where that happened.
        # Three tiny device ops and no sync: the check itself happens at the log boundary.
        already = (self.first_nonfinite > 0) | torch.isfinite(self.loss_sum.sum())
        self.first_nonfinite = torch.where(already, self.first_nonfinite, float(step))

    def rows(self, optimizer_state_bytes: int = 0) -> torch.Tensor:
        """One row per local slot (see COLUMNS). Synchronizes each of this process's GPUs once, so seconds are real
        and every CUDA event the clocks recorded (dp: on each replica's own GPU) can be read.
        The optimizer state is this process's; it goes into its first slot (dp replicas hold none)."""
        if self.device.type == "cuda":
            for dev in self.memory_devices or [self.device]:
                torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - self.start
        n = len(self.slot_sizes)
        rows = torch.zeros(n, len(COLUMNS), dtype=torch.float64)
        micro_batches = self.samples / max(1, sum(self.slot_sizes))
        rows[:, SAMPLES] = torch.tensor(self.slot_sizes, dtype=torch.float64) * micro_batches
        rows[:, SECONDS] = seconds
        rows[:, STEPS] = self.steps
        rows[:, SKIPPED_STEPS] = self.skipped_steps
        rows[:, DATA_SECONDS] = self.data_seconds
        rows[:, WAIT_SECONDS] = torch.as_tensor(self.wait_clock.read(n), dtype=torch.float64) if self.wait_clock else math.nan
        phases = self.wait_clock.phases(n) if self.wait_clock else None
        rows[:, FORWARD_SECONDS] = torch.as_tensor(phases["forward"], dtype=torch.float64) if phases else math.nan
        rows[:, BACKWARD_SECONDS] = torch.as_tensor(phases["backward"], dtype=torch.float64) if phases else math.nan
        # pipeline parallel: the time its stage spent receiving (framework/telemetry/pipeline_clock.py)
        comm = getattr(self.wait_clock, "comm", None)
        rows[:, COMM_SECONDS] = comm(n) if comm else math.nan
        traffic = self.traffic
        rows[:, BYTES_SENT] = traffic.sent if traffic else math.nan
        rows[:, BYTES_UNCOMPRESSED] = traffic.uncompressed if traffic else math.nan
        rows[:, COMPRESSED_STEPS] = traffic.compressed_steps if traffic else math.nan
        rows[0, OPTIMIZER_STATE] = optimizer_state_bytes / 2**20
        for i, dev in enumerate(self.memory_devices[:n]):
            rows[i, MAX_MEM] = torch.cuda.max_memory_allocated(dev) / 2**30
            rows[i, MAX_RESERVED] = torch.cuda.max_memory_reserved(dev) / 2**30
        rows = rows.to(self.device)
        rows[:, LOSS_SUM] = self.loss_sum
        rows[:, TOKENS] = self.tokens if self.counts_tokens else math.nan
        rows[:, FIRST_NONFINITE] = self.first_nonfinite
        rows[:, GLOBAL_LOSS_SUM] = self.global_loss_sum if self.counts_global_loss else math.nan
        return rows


@dataclass(kw_only=True)
class IntervalSummary:
    """What one log boundary reports, computed on rank 0 from the gathered rows."""

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
    # dp: each replica's forward and backward on its own GPU, per optimizer step (NaN for other strategies)
    per_slot_forward_ms: list[float]
    per_slot_backward_ms: list[float]
    # where the step counts tokens (StepOutput.tokens): each slot's tokens per second; else empty
    per_slot_tokens_per_sec: list[float] = dataclasses.field(default_factory=list)
    tokens: float = math.nan
    # pipeline parallel: each stage's communication per optimizer step (busy is then its compute); NaN elsewhere
    per_slot_comm_ms: list[float] = dataclasses.field(default_factory=list)
    # gradient bytes each slot handed to its collectives per optimizer step (framework/telemetry/traffic.py), what
    # they weigh uncompressed (all slots, the interval), and the steps that sent compressed; NaN where not counted
    per_slot_bytes_sent: list[float] = dataclasses.field(default_factory=list)
    bytes_sent: float = math.nan
    bytes_uncompressed: float = math.nan
    compressed_steps: float = math.nan
    # trainer.on_nonfinite=skip: the interval's steps whose optimizer step was skipped (their samples and loss are
    # not counted)
    skipped_steps: int = 0

    @property
    def trained(self) -> bool:
        """Whether any step of the interval trained: an interval of skipped steps has no loss and no throughput."""
        return self.steps > self.skipped_steps

    @property
    def compression_ratio(self) -> float:
        """What the gradients weigh over what was sent (NaN where nothing was counted)."""
        return self.bytes_uncompressed / self.bytes_sent if self.bytes_sent > 0 else math.nan

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

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
            per_slot_forward_ms=(rows[:, FORWARD_SECONDS] * 1000 / max(1, steps)).tolist(),
            per_slot_backward_ms=(rows[:, BACKWARD_SECONDS] * 1000 / max(1, steps)).tolist(),
            per_slot_tokens_per_sec=(rows[:, TOKENS] / interval).tolist() if not rows[:, TOKENS].isnan().any() else [],
            tokens=float(rows[:, TOKENS].sum()),
            per_slot_comm_ms=(comm * 1000 / max(1, steps)).tolist(),
            per_slot_bytes_sent=(rows[:, BYTES_SENT] / max(1, steps)).tolist(),
            bytes_sent=float(rows[:, BYTES_SENT].sum()),
            bytes_uncompressed=float(rows[:, BYTES_UNCOMPRESSED].sum()),
            compressed_steps=float(rows[0, COMPRESSED_STEPS]),
            skipped_steps=int(rows[0, SKIPPED_STEPS]),
        )
