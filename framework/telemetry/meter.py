"""The meter protocol: one telemetry number the loop reports at every log boundary is one class, registered once
(framework/telemetry/meter_registry.py). The loop knows none of them by name: it resets them all, hands each step's
StepRecord to all, gathers their rows from every rank and has rank 0 ask each for its tags; loggers write the tags.

A meter keeps its counts on the device between boundaries (adding never syncs). rows() is this process's share:
one row per local slot (a rank, or a dp replica), one column per name in `columns`, NaN where this engine does not
count it. summary() reads the columns of every slot (rank 0, after the gather) and returns {tag: value}: the names
TensorBoard, MLflow and metrics.csv show (docs/telemetry.md)."""
from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import ClassVar, Protocol

import torch


@dataclass(frozen=True)
class StepRecord:
    """What one optimizer step hands every meter: its micro-batches' per-sample losses and tokens (none when its
    optimizer step was skipped), trainer.invariant's loss summed over every rank, whether it was skipped, and the
    seconds the loop waited for its data (None where the loop did not time it)."""

    step: int
    losses: list[torch.Tensor] = field(default_factory=list)
    tokens: list = field(default_factory=list)  # per micro-batch: a count (a number or a device tensor), or None
    global_loss: torch.Tensor | None = None
    skipped: bool = False
    data_seconds: float | None = None


@dataclass(frozen=True)
class MeterSources:
    """What a meter may count from: this process's slots and device, the engine's hooks (the wait clock:
    framework/training/instrument.py; the gradient traffic: framework/telemetry/traffic.py), None where it has none,
    each slot's GPU (none on the CPU) and the optimizer."""

    slot_sizes: list[int]
    device: torch.device
    share: float = 1.0  # of each sample this process counts (model parallel peers share their samples)
    clock: object = None
    traffic: object = None
    _: KW_ONLY
    cuda_devices: tuple = ()
    optimizer: object = None


@dataclass(frozen=True)
class Interval:
    """What rank 0 gathered at a boundary: every slot's columns by name, the interval's steps, and its wall time
    (the longest window: every rate is over it, so the slots add up to the job)."""

    columns: dict[str, torch.Tensor]
    steps: int
    seconds: float
    trained: bool  # some step of the interval trained (an interval of skipped steps has no rates)

    @property
    def per_step(self) -> float:
        return 1 / max(1, self.steps)

    def per_rank(self, tag: str, name: str, scale: float = 1.0) -> dict[str, float]:
        """{tag/rank{r}: slot r's column x scale}; none where it is NaN (this engine does not count it)."""
        values = (self.columns[name] * scale).tolist()
        return {f"{tag}/rank{r}": value for r, value in enumerate(values) if value == value}


class Meter(Protocol):
    """A meter that reads its number at the boundary may subclass this for reset() and add() that keep nothing."""

    columns: ClassVar[tuple[str, ...]]

    def __init__(self, sources: MeterSources): ...

    def reset(self) -> None:
        """A new interval."""

    def add(self, record: StepRecord) -> None:
        """One optimizer step."""

    def rows(self) -> torch.Tensor:
        """(slots, len(columns)) float64, on any device."""

    @staticmethod
    def summary(interval: Interval) -> dict[str, float]: ...
