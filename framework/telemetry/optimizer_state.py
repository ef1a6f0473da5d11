"""Bytes of optimizer state this process holds (memory/optimizer_state_mib/rank{r}): what a sharding engine saves
shows here. The state of the innermost torch optimizer (DeepSpeed's ZeRO wraps one whose parameters are this rank's
flat partitions), a DTensor counted by its local shard (fsdp). OptimizerStateMeter is the number's meter
(framework/telemetry/meter.py): the process's first slot holds it (dp replicas hold none)."""
from __future__ import annotations

import math
import sys

import torch

from framework.telemetry.meter import Interval, MeterSources, StepRecord


def innermost_torch_optimizer(optimizer):
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def optimizer_state_bytes(optimizer) -> int:
    # A DTensor exists only once its module was imported (by fsdp): never import it here (a second per process)
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", ())
    total = 0
    for state in innermost_torch_optimizer(optimizer).state.values():
        for t in state.values():
            if torch.is_tensor(t):
                local = t.to_local() if isinstance(t, dtensor) else t
                total += local.numel() * local.element_size()
    return total


class OptimizerStateMeter:
    columns = ("optimizer_state_mib",)
    charts = {"memory": [("optimizer state MiB per rank", r"^memory/optimizer_state_mib/rank\d+$")]}

    def __init__(self, sources: MeterSources):
        self.optimizer, self.slots = sources.optimizer, len(sources.slot_sizes)

    def reset(self) -> None:
        """Read at the boundary: nothing to count between."""

    def add(self, record: StepRecord) -> None:
        """Read at the boundary: nothing to count between."""

    def rows(self) -> torch.Tensor:
        if self.optimizer is None:
            return torch.full((self.slots, 1), math.nan, dtype=torch.float64)
        rows = torch.zeros(self.slots, 1, dtype=torch.float64)
        rows[0] = optimizer_state_bytes(self.optimizer) / 2**20
        return rows

    @staticmethod
    def summary(interval: Interval) -> dict[str, float]:
        return {f"memory/optimizer_state_mib/rank{r}": mib
                for r, mib in enumerate(interval.columns["optimizer_state_mib"].tolist()) if mib == mib}
