"""What tells one GPU from another at a log boundary: FLOP/s and MFU per device, and the straggler line.

Built once at start on every rank (one gather of each slot's host, device and peak), used on rank 0 only."""
from __future__ import annotations

import math
import socket
import statistics
from dataclasses import dataclass, field

import torch
from torch import nn

from framework.telemetry.flops import training_flops_per_sample
from framework.telemetry.gpu_peaks import KNOWN, is_mig, peak_tflops, precision_key
from framework.telemetry.meters import IntervalSummary


@dataclass
class Slot:
    host: str
    device: str  # "cuda:1", "cpu"
    device_name: str  # torch.cuda.get_device_name, or "cpu"
    peak_tflops: float | None  # dense peak for the run's precision; None: unknown, no MFU


@dataclass
class Straggler:
    rank: int
    slot: Slot
    busy_ms: float
    median_ms: float
    intervals: int  # log intervals in a row past the threshold

    @property
    def ratio(self) -> float:
        return self.busy_ms / self.median_ms

    def line(self, step: int, threshold: float) -> str:
        return (f"straggler at step {step}: rank {self.rank} on {self.slot.host} ({self.slot.device}) was busy "
                f"{self.busy_ms:.1f} ms/step, {self.ratio:.2f}x the median {self.median_ms:.1f} ms "
                f"(trainer.straggler_threshold={threshold:g}; {self.intervals} log intervals in a row)")


def local_slots(devices: list[torch.device], slots: int, precision: str, convolutions: bool) -> list[Slot]:
    """The first `slots` of this process's devices: those its micro-batch runs on (dp: device_ids[:chunks])."""
    host = socket.gethostname()
    cuda = [d.index for d in devices if d.type == "cuda"][:slots]
    if not cuda:
        return [Slot(host, str(devices[0]), "cpu", None) for _ in range(slots)]
    return [Slot(host, f"cuda:{i}", name, peak_tflops(name, precision, convolutions, sm_count(i)))
            for i, name in ((i, torch.cuda.get_device_name(i)) for i in cuda)]


def count_flops(model: nn.Module, example, micro_batch: int) -> float | str:
    """FLOPs per training sample of the user's module before any wrapper (ZeRO-3 would partition its weights in
    place), or why they could not be counted (a forward that cannot run on meta tensors)."""
    try:
        return training_flops_per_sample(model, example, micro_batch)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


class PerGpu:
    def __init__(self, slots: list[Slot], flops_per_sample: float | None, straggler_threshold: float,
                 straggler_intervals: int = 1, straggler_min_gap_ms: float = 0.0):
        self.slots, self.flops_per_sample, self.threshold = slots, flops_per_sample, straggler_threshold
        self.intervals, self.min_gap_ms = straggler_intervals, straggler_min_gap_ms
        self._streaks = [0] * len(slots)  # log intervals in a row each slot was past the threshold

    def flops_line(self, model_flops: float | str, precision: str, convolutions: bool) -> str:
        """What rank 0 says at the start: the FLOPs counted (or why not) and what MFU is measured against."""
        if isinstance(model_flops, str):
            return f"model FLOPs not counted ({model_flops}); no throughput/device/tflops or mfu tags"
        return (f"model FLOPs: {model_flops / 1e6:,.2f} MFLOP per training sample (forward + backward, counted once); "
                f"{_mfu_note(self.slots, precision_key(precision, convolutions))}")

    def report(self, s: IntervalSummary, logged: dict[str, float]) -> "IntervalReport":
        tflops = self.tflops(s)
        return IntervalReport(s, tflops, self.mfu(tflops), self.stragglers(s), self.threshold, logged)

    def tflops(self, s: IntervalSummary) -> list[float]:
        """FLOP/s each device did over the interval's wall time (the standard MFU numerator), in TFLOP/s."""
        if not self.flops_per_sample:
            return []
        return [self.flops_per_sample * rate / 1e12 for rate in s.per_slot_samples_per_sec]

    def mfu(self, tflops: list[float]) -> list[float | None]:
        return [rate / slot.peak_tflops if slot.peak_tflops else None for rate, slot in zip(tflops, self.slots)]

    def stragglers(self, s: IntervalSummary) -> list[Straggler]:
        busy = s.per_slot_busy_ms
        # Without measured waits busy is the lock-stepped wall time, the same on every rank: nothing to compare.
        if len(busy) < 2 or any(math.isnan(w) for w in s.per_slot_wait_ms):
            return []
        median = statistics.median(busy)
        if not median > 0 or math.isnan(median):
            return []
        # A loaded machine makes some rank 1.2-1.4x slower for an interval now and then: only a gap that persists
        # and is large in absolute terms too names a straggler.
        for r, ms in enumerate(busy):
            past = ms / median > self.threshold and ms - median >= self.min_gap_ms
            self._streaks[r] = self._streaks[r] + 1 if past else 0
        return [Straggler(r, self.slots[r], ms, median, self._streaks[r]) for r, ms in enumerate(busy)
                if self._streaks[r] >= self.intervals]


@dataclass
class IntervalReport:
    """What one log boundary tells, on rank 0: the gathered meters, and what tells the GPUs apart."""

    summary: IntervalSummary
    tflops: list[float]  # per slot; empty when the FLOPs could not be counted
    mfu: list[float | None]  # per slot; None where the GPU's peak is unknown
    stragglers: list[Straggler]
    straggler_threshold: float
    # what callbacks logged since the last boundary (LoopState.log_scalar): tag -> value, written by every logger
    logged: dict[str, float] = field(default_factory=dict)


def has_convolutions(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())


def _mfu_note(slots: list[Slot], key: str) -> str:
    unknown = sorted({s.device_name for s in slots if s.peak_tflops is None})
    if not unknown:
        peaks = ", ".join(sorted({f"{s.device_name} {s.peak_tflops:.4g}" for s in slots}))
        mig = " (a MIG slice: the GPU's peak x its share of the SMs)" if any(is_mig(s.device_name) for s in slots) else ""
        return f"MFU against the dense {key} peak TFLOP/s ({peaks}){mig}"
    if unknown == ["cpu"]:
        return "TFLOP/s without MFU: CPUs have no peak in the table (framework/telemetry/gpu_peaks.py)"
    if all(is_mig(name) for name in unknown):
        return (f"TFLOP/s without MFU for {', '.join(unknown)}: a MIG slice of a GPU whose SM count is not in the "
                "table (framework/telemetry/gpu_peaks.py)")
    return (f"TFLOP/s without MFU for {', '.join(unknown)}: no dense peak known (the table has {KNOWN}; "
            "framework/telemetry/gpu_peaks.py)")
