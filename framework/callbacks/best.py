"""The run's best and last weights: after every evaluation that improves trainer.objective (by more than min_delta),
the checkpoint just committed for that step is kept apart in checkpoints/best/ (resumable, never pruned by the
rolling ones) and its model's weights are written to weights/best.pt; at the end of training, weights/last.pt. A
transformers model is also saved in its own format, pretrained/best/ and pretrained/last/ (from_pretrained loads it).
The best value so far travels in the checkpoints, so a resumed run keeps comparing against it."""
from __future__ import annotations

import math
from pathlib import Path

from framework.callbacks.base import Callback, LoopState
from framework.checkpoints.pretrained import is_pretrained_model, write_pretrained
from framework.checkpoints.weights import write_weights


class KeepBest(Callback):
    def __init__(self, min_delta: float = 0.0):
        self.min_delta = float(min_delta)
        self.best: float | None = None
        self.best_step: int | None = None

    def improved(self, state, result) -> bool:
        value = state.objective_value(result)
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        gain = value - self.best if state.higher_is_better else self.best - value
        return gain > self.min_delta

    def on_evaluation_end(self, state, step: int, result) -> None:
        # rank 0 has the result: it decides, and every rank follows (the copy and the export are collective)
        decision = self.improved(state, result) if state.is_main else None
        if not state.broadcast_object(decision):
            return
        if state.is_main:
            self.best, self.best_step = state.objective_value(result), step
        state.keep_checkpoint_as_best(step)
        path = export_weights(state, "best")
        if path is not None:
            state.say(f"best {state.objective} so far ({self.best:.4f} at step {step}): {path}")

    def on_fit_end(self, state) -> None:
        export_weights(state, "last")

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_step = state.get("best"), state.get("best_step")


def export_weights(state: LoopState, name: str) -> Path | None:
    """Every rank calls it (a sharding engine gathers): the model's full weights into weights/<name>.pt, written by
    rank 0 (framework/checkpoints/weights.py); the path there, None elsewhere."""
    weights = state.full_model_state()
    if not state.is_main:
        return None
    return write_run_weights(state, name, weights)


def write_run_weights(state: LoopState, name: str, weights: dict) -> Path | None:
    """Rank 0: a full state dict of the model into weights/<name>.pt with the run's step and objective; on a disk
    error a warning, and the run goes on."""
    value = state.totals.val_loss if state.objective == "loss" else state.totals.val_metrics.get(state.objective)
    try:
        path = write_weights(state.run_dir, name, weights, state.model_record, step=state.step,
                             objective={"name": state.objective, "value": value})
        if is_pretrained_model(state.model):  # a transformers model: its own format too
            write_pretrained(state.run_dir, name, state.model, weights)
        return path
    except OSError as error:  # a by-product of the checkpoints, which keep the same weights: the run goes on
        state.say(f"warning: weights/{name}.pt could not be written in {state.run_dir}: {error.strerror or error}; "
                  "the checkpoints hold the same model")
        return None
