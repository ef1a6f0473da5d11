"""The invariant mode's loss/train (trainer.invariant): the interval's loss from each step's loss summed over every
rank's micro-shards in shard order (InvariantStep), the same on every rank, so it is the same bits on any world size.
Registered by the mode (InvariantStep.meters, at assembly); each rank's own loss still makes loss/train/rank{r}."""
from __future__ import annotations

import torch

from framework.telemetry.meter import Interval, MeterSources, StepRecord


class GlobalLossMeter:
    columns = ("global_loss_sum",)

    def __init__(self, sources: MeterSources):
        self.slots = len(sources.slot_sizes)
        self.sum = torch.zeros((), device=sources.device, dtype=torch.float64)

    def reset(self) -> None:
        self.sum.zero_()

    def add(self, record: StepRecord) -> None:
        if record.global_loss is not None:  # none for a skipped step
            self.sum += record.global_loss

    def rows(self) -> torch.Tensor:
        return self.sum.expand(self.slots, 1)

    @staticmethod
    def summary(interval: Interval) -> dict[str, float]:
        if not interval.trained:
            return {}
        samples = interval.columns["samples"].sum().clamp_min(1)
        return {"loss/train": float(interval.columns["global_loss_sum"][0] / samples)}
