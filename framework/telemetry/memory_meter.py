"""memory/optimizer_state_mib/rank{r} (the optimizer state this process holds, framework/telemetry/optimizer_state.py,
in its first slot: dp replicas hold none), memory/max_allocated_gib/rank{r} and memory/max_reserved_gib/rank{r}
(CUDA only: each slot's GPU's peaks within the interval, reset at every boundary, so evaluation's peak never shows in
a training point)."""
from __future__ import annotations

import math

import torch

from framework.telemetry.meter import Interval, Meter, MeterSources
from framework.telemetry.optimizer_state import optimizer_state_bytes

TAGS = {"optimizer_state_mib": "memory/optimizer_state_mib", "max_mem_gib": "memory/max_allocated_gib",
        "max_reserved_gib": "memory/max_reserved_gib"}


class MemoryMeter(Meter):
    columns = tuple(TAGS)
    charts = {"memory": [
        ("peak allocated GiB per rank (interval)", r"^memory/max_allocated_gib/rank\d+$"),
        ("peak reserved GiB per rank (interval)", r"^memory/max_reserved_gib/rank\d+$"),
        ("optimizer state MiB per rank", r"^memory/optimizer_state_mib/rank\d+$"),
    ]}

    def __init__(self, sources: MeterSources):
        self.optimizer, self.gpus, self.slots = sources.optimizer, list(sources.cuda_devices), len(sources.slot_sizes)

    def reset(self) -> None:
        for gpu in self.gpus:
            torch.cuda.reset_peak_memory_stats(gpu)

    def rows(self) -> torch.Tensor:
        rows = torch.full((self.slots, len(self.columns)), math.nan, dtype=torch.float64)
        if self.optimizer is not None:
            rows[:, 0] = 0.0
            rows[0, 0] = optimizer_state_bytes(self.optimizer) / 2**20
        for i, gpu in enumerate(self.gpus[:self.slots]):
            rows[i, 1:] = torch.tensor([torch.cuda.max_memory_allocated(gpu), torch.cuda.max_memory_reserved(gpu)],
                                       dtype=torch.float64) / 2**30
        return rows

    @staticmethod
    def summary(interval: Interval) -> dict[str, float]:
        return {key: value for column, tag in TAGS.items() for key, value in interval.per_rank(tag, column).items()}
