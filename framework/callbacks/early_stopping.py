"""Early stopping on trainer.objective: when `patience` evaluations in a row have not improved it by more than
min_delta, the run ends after that evaluation, on every rank at the same step (rank 0 decides, every rank hears).
Lower is better for loss and for metrics that say so (torchmetrics' higher_is_better); higher otherwise."""
from __future__ import annotations

import math

from framework.callbacks.base import Callback
from framework.config.rules import at_least, at_least_number, require


class EarlyStopping(Callback):
    def __init__(self, patience: int = 3, min_delta: float = 0.0):
        self.patience = require("callbacks.early_stopping.patience", patience, at_least(1))
        self.min_delta = float(require("callbacks.early_stopping.min_delta", min_delta, at_least_number(0)))
        self.best: float | None = None
        self.without_improvement = 0

    def _verdict(self, state, result) -> str | None:
        value = state.objective_value(result)
        if self.best is None or (math.isfinite(value) and (
                value - self.best if state.higher_is_better else self.best - value) > self.min_delta):
            self.best, self.without_improvement = value, 0
            return None
        self.without_improvement += 1
        if self.without_improvement < self.patience:
            return None
        return (f"early stopping: {state.objective} has not improved on {self.best:.4f} by more than "
                f"{self.min_delta:g} in {self.patience} evaluation(s)")

    def on_evaluation_end(self, state, step: int, result) -> None:
        verdict = state.broadcast_object(self._verdict(state, result) if state.is_main else None)
        if verdict:
            state.request_stop(verdict)

    def state_dict(self) -> dict:
        return {"best": self.best, "without_improvement": self.without_improvement}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.without_improvement = state.get("best"), state.get("without_improvement", 0)
