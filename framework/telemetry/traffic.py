"""Gradient bytes on the wire, counted where they leave: the tensors an engine hands to its gradient collectives (ddp's
communication hook, fsdp's reduce-scatter, Horovod's compressor), beside what the same gradients weigh in their own
dtype. Counted per rank and read at each log boundary (comm/bytes_sent/rank{r}, comm/compression_ratio).

"Sent" is the payload handed to the collective, not what its algorithm moves (a ring all-reduce moves about twice
the payload; the ratio of the two is the same with or without compression). Counting is two integer additions per
collective call, on the thread that makes the call; nothing synchronizes the device. GradientBytesMeter is the
number's meter (framework/telemetry/meter.py), and its run totals: what result.json reports of the traffic."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from framework.telemetry.meter import Interval, MeterSources, StepRecord


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Traffic:
    """What this rank handed to its gradient collectives since the last reset (a log interval), and how many of the
    optimizer steps in it sent fewer bytes than their gradients weigh (compressed steps)."""

    def __init__(self, label: str = "none"):
        self.label = label  # what the run calls its compression: "none", "fp16", "powersgd rank 2"
        self.reset()

    def reset(self) -> None:
        self.sent = 0
        self.uncompressed = 0
        self.compressed_steps = 0
        self._step_sent = 0
        self._step_uncompressed = 0

    def add(self, sent: int, uncompressed: int) -> None:
        """Bytes handed to a collective, and what the same gradients weigh in their own dtype."""
        self.sent += sent
        self.uncompressed += uncompressed
        self._step_sent += sent
        self._step_uncompressed += uncompressed

    def end_step(self) -> None:
        """An optimizer step is done (the meter says so): was what it sent compressed?"""
        if self._step_sent < self._step_uncompressed:
            self.compressed_steps += 1
        self._step_sent = self._step_uncompressed = 0


class GradientBytesMeter:
    """comm/bytes_sent/rank{r} (gradient bytes each rank handed to its collectives per optimizer step) and
    comm/compression_ratio (what they weigh uncompressed over what was sent, all ranks); absent where the engine
    counts none (CountsTraffic)."""

    columns = ("bytes_sent", "bytes_uncompressed", "compressed_steps")
    charts = {"comm": [("gradient bytes sent per step per rank", r"^comm/bytes_sent/rank\d+$")]}

    def __init__(self, sources: MeterSources):
        self.traffic, self.slots = sources.traffic, len(sources.slot_sizes)

    def reset(self) -> None:
        if self.traffic:
            self.traffic.reset()

    def add(self, record: StepRecord) -> None:
        if self.traffic:
            self.traffic.end_step()

    def rows(self) -> torch.Tensor:
        t = self.traffic
        counts = [t.sent, t.uncompressed, t.compressed_steps] if t else [math.nan] * len(self.columns)
        return torch.tensor([counts] * self.slots, dtype=torch.float64)

    @staticmethod
    def summary(interval: Interval) -> dict[str, float]:
        tags = interval.per_rank("comm/bytes_sent", "bytes_sent", interval.per_step)
        sent, full = (float(interval.columns[c].sum()) for c in ("bytes_sent", "bytes_uncompressed"))
        if sent > 0:
            tags["comm/compression_ratio"] = full / sent
        return tags

    @staticmethod
    def add_to_run(s, uncompressed: dict[str, float], compressed: dict[str, float]) -> None:
        """One logged interval (s: framework/telemetry/meters.py's IntervalSummary) into the run's totals (RunTotals'
        two checkpointed dicts), when all its steps sent uncompressed (a powersgd run's warm-up, or no compression) or
        all compressed: steps, their wait (ms per step, mean over ranks, times steps), bytes sent and what they weigh
        uncompressed (all ranks), ranks. An interval with both kinds of steps counts in neither."""
        sent = s.columns.get("bytes_sent", [math.nan])
        if not s.steps or any(b != b for b in sent):  # NaN: this engine's gradient bytes are not counted
            return
        compressed_steps = s.columns["compressed_steps"][0]
        phase = compressed if compressed_steps == s.steps else (uncompressed if compressed_steps == 0 else None)
        if phase is None:
            return
        waits = [w for w in s.per_slot_wait_ms if w == w]
        counted = {"steps": s.steps, "wait_ms": sum(waits) / len(waits) * s.steps if waits else math.nan,
                   "sent": sum(sent), "full": sum(s.columns["bytes_uncompressed"]), "ranks": len(sent)}
        for key, value in counted.items():
            phase[key] = value if key == "ranks" else phase.get(key, 0.0) + value

    @staticmethod
    def run_result(uncompressed: dict[str, float], compressed: dict[str, float]) -> dict[str, float]:
        """What RunResult reports from the run's totals: the compression's ratio (over its compressed steps; without
        any, over the run), gradient bytes per rank and step (likewise), and the wait per step without and with
        compression; nothing where the engine counts no gradient bytes."""
        main = compressed if compressed.get("steps") else uncompressed
        if not main.get("steps"):
            return {}
        wait = (lambda phase: phase["wait_ms"] / phase["steps"] if phase.get("steps") else math.nan)
        return {"compression_ratio": main["full"] / main["sent"] if main["sent"] else math.nan,
                "gradient_bytes_per_step": main["sent"] / (main["steps"] * max(1, main["ranks"])),
                "wait_ms_uncompressed": wait(uncompressed), "wait_ms_compressed": wait(compressed)}


class CountedReduceScatter:
    """FSDP2's reduce-scatter of gradients (FSDPModule.set_custom_reduce_scatter), counted: the collective its default
    makes (torch.distributed.reduce_scatter_single), its input (in the reduce dtype) counted as sent and, as what it
    weighs uncompressed, the same elements in the parameters' dtype. It answers torch's ReduceScatter interface
    (allocate, __call__) without subclassing it: that class lives in a private module of FSDP2."""

    def __init__(self, traffic: Traffic, parameter_element_size: int):
        self.traffic, self.full = traffic, parameter_element_size

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op: bool = False):
        self.traffic.add(nbytes(input_tensor), input_tensor.numel() * self.full)
        return dist.reduce_scatter_single(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
