"""Weights-only files: `<run folder>/weights/best.pt` and `last.pt`, the user's module's full state dict (gathered
from the shards where a strategy shards it) beside what rebuilds the model: its config, input shape and class count
(and a text dataset's vocabulary).
Plain tensors and values only, so torch.load(weights_only=True) reads them; written atomically by rank 0.
framework/results/trained_model.py loads one back as a ready model."""
from __future__ import annotations

import io
from pathlib import Path

import torch

from framework.checkpoints.store import write_atomically

WEIGHTS_DIR = "weights"


def write_weights(run_dir: Path, name: str, state: dict, model_config: dict, in_shape, num_classes, step: int,
                  objective: dict, vocab: list[str] | None = None) -> Path:
    folder = run_dir / WEIGHTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.pt"
    buffer = io.BytesIO()
    torch.save({"model": state, "model_config": model_config, "in_shape": list(in_shape) if in_shape else None,
                "num_classes": num_classes, "step": step, "objective": objective, "vocab": vocab}, buffer)
    write_atomically(path, buffer.getvalue())
    return path


def read_weights(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)
