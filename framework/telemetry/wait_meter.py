"""time/wait_ms/rank{r}, time/comm_ms/rank{r}, time/forward_ms/rank{r} and time/backward_ms/rank{r}, per optimizer
step, from the engine's wait clock (framework/training/instrument.py: the engine's OwnClock): a rank's waits for the
others (pipeline parallel: its stage's bubble), its measured communication (pipeline parallel), and its forward and
backward (dp replicas, pipeline stages). A column is NaN, and its tag absent, where the clock cannot tell it; busy
(time/busy_ms) is the step less wait and comm (framework/telemetry/meters.py)."""
from __future__ import annotations

import math

import torch

from framework.telemetry.meter import Interval, Meter, MeterSources

TAGS = {"wait_seconds": "time/wait_ms", "comm_seconds": "time/comm_ms", "forward_seconds": "time/forward_ms",
        "backward_seconds": "time/backward_ms"}


class WaitMeter(Meter):  # add(): the clock's hooks count as the step runs
    columns = tuple(TAGS)
    charts = {"time": [
        ("wait ms per step per rank (blocked on the others)", r"^time/wait_ms/rank\d+$"),
        ("communication ms per step per pipeline stage", r"^time/comm_ms/rank\d+$"),
        ("forward ms per step per dp replica or pipeline stage", r"^time/forward_ms/rank\d+$"),
        ("backward ms per step per dp replica or pipeline stage", r"^time/backward_ms/rank\d+$"),
    ]}

    def __init__(self, sources: MeterSources):
        self.clock, self.slots = sources.clock, len(sources.slot_sizes)

    def reset(self) -> None:
        if self.clock:
            self.clock.reset()

    def rows(self) -> torch.Tensor:
        """Read after the frame's device sync (a GPU clock's CUDA events)."""
        rows = torch.full((self.slots, len(self.columns)), math.nan, dtype=torch.float64)
        clock, n = self.clock, self.slots
        if clock is None:
            return rows
        rows[:, 0] = torch.as_tensor(clock.read(n), dtype=torch.float64)
        comm = getattr(clock, "comm", None)  # pipeline parallel: the time its stage spent receiving
        if comm:
            rows[:, 1] = comm(n)
        phases = clock.phases(n)  # dp replicas, pipeline stages
        if phases:
            rows[:, 2] = torch.as_tensor(phases["forward"], dtype=torch.float64)
            rows[:, 3] = torch.as_tensor(phases["backward"], dtype=torch.float64)
        return rows

    @staticmethod
    def summary(interval: Interval) -> dict[str, float]:
        ms = 1000 * interval.per_step
        return {key: value for column, tag in TAGS.items() for key, value in interval.per_rank(tag, column, ms).items()}
