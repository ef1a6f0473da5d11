"""memory/max_allocated_gib/rank{r} and memory/max_reserved_gib/rank{r}: each slot's GPU's peak allocated and reserved
memory within the interval (CUDA only: no tag on the CPU). The peaks are reset at every boundary, so evaluation's
peak never shows in a training point."""
from __future__ import annotations

import math

import torch

from framework.telemetry.meter import Interval, MeterSources, StepRecord

TAGS = {"max_mem_gib": "memory/max_allocated_gib", "max_reserved_gib": "memory/max_reserved_gib"}


class PeakMemoryMeter:
    columns = tuple(TAGS)
    charts = {"memory": [
        ("peak allocated GiB per rank (interval)", r"^memory/max_allocated_gib/rank\d+$"),
        ("peak reserved GiB per rank (interval)", r"^memory/max_reserved_gib/rank\d+$"),
    ]}

    def __init__(self, sources: MeterSources):
        self.devices, self.slots = list(sources.cuda_devices), len(sources.slot_sizes)

    def reset(self) -> None:
        for device in self.devices:
            torch.cuda.reset_peak_memory_stats(device)

    def add(self, record: StepRecord) -> None:
        """The allocator keeps the peaks."""

    def rows(self) -> torch.Tensor:
        rows = torch.full((self.slots, len(self.columns)), math.nan, dtype=torch.float64)
        for i, device in enumerate(self.devices[:self.slots]):
            rows[i] = torch.tensor([torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)],
                                   dtype=torch.float64) / 2**30
        return rows

    @staticmethod
    def summary(interval: Interval) -> dict[str, float]:
        peaks = [interval.columns[column].tolist() for column in TAGS]
        return {f"{tag}/rank{r}": slot[i] for r, slot in enumerate(zip(*peaks)) for i, tag in enumerate(TAGS.values())
                if slot[i] == slot[i]}
