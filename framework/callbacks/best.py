"""The run's best and last weights: after every evaluation that improves trainer.objective (by more than min_delta),
the checkpoint just committed for that step is kept apart in checkpoints/best/ (resumable, never pruned by the
rolling ones) and its model's weights are written to weights/best.pt; at the end of training, weights/last.pt. A
transformers model is also saved in its own format, pretrained/best/ and pretrained/last/ (from_pretrained loads it).
The best value so far travels in the checkpoints, so a resumed run keeps comparing against it."""
from __future__ import annotations

import math
from pathlib import Path

from framework.callbacks.base import Callback
from framework.checkpoints.pretrained import is_pretrained_model, write_pretrained
from framework.checkpoints.weights import write_weights


class KeepBest(Callback):
    def __init__(self, min_delta: float = 0.0):
        self.min_delta = float(min_delta)
        self.best: float | None = None
        self.best_step: int | None = None

    def improved(self, trainer, result) -> bool:
        value = trainer.objective_value(result)
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        gain = value - self.best if trainer.higher_is_better else self.best - value
        return gain > self.min_delta

    def on_evaluation_end(self, trainer, step: int, result) -> None:
        # rank 0 has the result: it decides, and every rank follows (the copy and the export are collective)
        decision = self.improved(trainer, result) if trainer.is_main else None
        if not trainer.group.broadcast_object(decision):
            return
        if trainer.is_main:
            self.best, self.best_step = trainer.objective_value(result), step
        trainer.checkpointer.keep_best(step)
        path = export_weights(trainer, "best")
        if path is not None:
            trainer.say(f"best {trainer.objective} so far ({self.best:.4f} at step {step}): {path}")

    def on_fit_end(self, trainer) -> None:
        export_weights(trainer, "last")

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_step = state.get("best"), state.get("best_step")


def export_weights(trainer, name: str) -> Path | None:
    """Every rank calls it (a sharding engine gathers): the model's full weights into weights/<name>.pt, written by
    rank 0 (framework/checkpoints/weights.py); the path there, None elsewhere."""
    state = trainer.wrapped.checkpoint_io.full_model_state(trainer.wrapped.module)
    if not trainer.is_main:
        return None
    return write_run_weights(trainer, name, state)


def write_run_weights(trainer, name: str, state: dict) -> Path | None:
    """Rank 0: a full state dict of the model into weights/<name>.pt with the run's step and objective; on a disk
    error a warning, and the run goes on."""
    value = trainer.totals.val_loss if trainer.objective == "loss" else trainer.totals.val_metrics.get(trainer.objective)
    try:
        path = write_weights(trainer.run_dir, name, state, step=trainer.step,
                             objective={"name": trainer.objective, "value": value}, **trainer.run.model_record)
        if is_pretrained_model(trainer.wrapped.module):  # a transformers model: its own format too
            write_pretrained(trainer.run_dir, name, trainer.wrapped.module, state)
        return path
    except OSError as error:  # a by-product of the checkpoints, which keep the same weights: the run goes on
        trainer.say(f"warning: weights/{name}.pt could not be written in {trainer.run_dir}: {error.strerror or error}; "
                    "the checkpoints hold the same model")
        return None
