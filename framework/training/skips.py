"""trainer.max_consecutive_skips: a run whose optimizer steps are skipped one after another (trainer.on_nonfinite=skip,
or fp16's GradScaler) is not training, and must not end as if it had."""
from __future__ import annotations


class SkipStreak:
    """Counts the optimizer steps skipped in a row; every rank sees the same skips (the gradients are all-reduced
    before the check), so every rank reaches the bound at the same step."""

    def __init__(self, bound: int):
        self.bound = bound
        self.first: int | None = None  # the first step of the current streak
        self.count = 0

    def record(self, step: int, stepped: bool) -> str | None:
        """After each step: why the run must stop (the bound reached), else None."""
        if stepped:
            self.first, self.count = None, 0
            return None
        self.first = step if self.first is None else self.first
        self.count += 1
        if self.count < self.bound:
            return None
        return (f"{self.count} optimizer steps in a row (steps {self.first} to {step}) were skipped for a non-finite "
                f"loss or gradient (trainer.max_consecutive_skips={self.bound}): the run is not training")
