"""throughput/tokens_per_sec and throughput/tokens_per_sec/rank{r}: where the step says what a token is
(StepOutput.tokens), the tokens each slot trained per second of the interval's wall time."""
from __future__ import annotations

import math

import torch

from framework.telemetry.meter import Interval, MeterSources, StepRecord


class TokensMeter:
    columns = ("tokens",)
    charts = {"throughput": [("tokens/s per rank", r"^throughput/tokens_per_sec/rank\d+$")]}

    def __init__(self, sources: MeterSources):
        sizes = sources.slot_sizes
        self.share = sources.share
        # a micro-batch's tokens, shared by its slots by their size (dp: the step sees the whole process's batch)
        self.token_shares = torch.tensor(sizes, device=sources.device, dtype=torch.float64) / max(1, sum(sizes))
        self.tokens = torch.zeros(len(sizes), device=sources.device, dtype=torch.float64)
        self.counts = False  # whether the step says what a token is

    def reset(self) -> None:
        self.tokens.zero_()

    def add(self, record: StepRecord) -> None:
        for count in record.tokens:  # a number or a tensor on the device: no sync
            if count is not None:
                self.counts = True
                self.tokens += self.token_shares * (count * self.share)

    def rows(self) -> torch.Tensor:
        return (self.tokens if self.counts else torch.full_like(self.tokens, math.nan)).unsqueeze(1)

    @staticmethod
    def summary(interval: Interval) -> dict[str, float]:
        tokens = interval.columns["tokens"]
        if tokens.isnan().any() or not interval.trained:
            return {}
        return {"throughput/tokens_per_sec": float(tokens.sum()) / interval.seconds,
                **interval.per_rank("throughput/tokens_per_sec", "tokens", 1 / interval.seconds)}
