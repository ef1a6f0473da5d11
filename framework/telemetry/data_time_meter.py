"""time/data_ms: per optimizer step, the mean slot's wait for its batches (the loop times each fetch and hands the
step's total in its StepRecord)."""
from __future__ import annotations

import math

import torch

from framework.telemetry.meter import Interval, MeterSources, StepRecord


class DataTimeMeter:
    columns = ("data_seconds",)

    def __init__(self, sources: MeterSources):
        self.slots = len(sources.slot_sizes)
        self.seconds = math.nan  # until a step says how long its data took

    def reset(self) -> None:
        self.seconds = math.nan

    def add(self, record: StepRecord) -> None:
        if record.data_seconds is not None:
            self.seconds = record.data_seconds + (0.0 if math.isnan(self.seconds) else self.seconds)

    def rows(self) -> torch.Tensor:
        return torch.full((self.slots, 1), self.seconds, dtype=torch.float64)

    @staticmethod
    def summary(interval: Interval) -> dict[str, float]:
        seconds = float(interval.columns["data_seconds"].mean())
        return {"time/data_ms": seconds * 1000 * interval.per_step} if seconds == seconds else {}
