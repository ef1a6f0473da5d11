"""Weights-only files: `<run folder>/weights/best.pt` and `last.pt`, the user's module's full state dict (gathered
from the shards where a strategy shards it) beside what rebuilds the model: its config, input shape and class count
(and a text dataset's vocabulary). Plain tensors and values only, so torch.load(weights_only=True) reads them.

Beside each, the same weights as `best.safetensors` / `last.safetensors`: the model's own keys, CPU tensors (tied
parameters stored under each of their keys), and the rest as string metadata (`model_target`, `model_config`,
`in_shape`, `num_classes`, `step`, `objective`, `vocab`: JSON). Read with `safetensors.torch.load_file(path)` (no
pickle at all), or framework/results/trained_model.py's load_model. Both written atomically by rank 0."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_bytes

from framework.checkpoints.store import serialized, write_atomically

WEIGHTS_DIR = "weights"
SUFFIXES = (".safetensors", ".pt")  # a weights file's formats, the one read first first
_JSON_KEYS = ("model_config", "in_shape", "num_classes", "step", "objective", "vocab")


def write_weights(run_dir: Path, name: str, state: dict, model: dict, step: int, objective: dict) -> Path:
    """weights/<name>.safetensors and weights/<name>.pt; returns the .pt's path. model: what rebuilds it
    (model_config, in_shape, num_classes, and vocab where the dataset has one: framework/assemble.py's model_record)."""
    folder = run_dir / WEIGHTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    in_shape = model["in_shape"]
    record = {"model_config": model["model_config"], "in_shape": list(in_shape) if in_shape else None,
              "num_classes": model["num_classes"], "step": step, "objective": objective, "vocab": model.get("vocab")}
    try:
        write_atomically(folder / f"{name}.safetensors", as_safetensors(state, record))
    except TypeError as exc:  # a module whose state_dict() holds extra state that is no tensor: the .pt keeps it
        warnings.warn(f"{folder / name}.safetensors not written: {exc} (the .pt holds it)", stacklevel=2)
    path = folder / f"{name}.pt"
    write_atomically(path, serialized({"model": state, **record}))
    return path


def find_weights(run_dir: Path, names: tuple[str, ...]) -> Path | None:
    """The run folder's first weights file of `names` (in that order), each in SUFFIXES' order; None without any."""
    found = (Path(run_dir) / WEIGHTS_DIR / f"{name}{suffix}" for name in names for suffix in SUFFIXES)
    return next((path for path in found if path.is_file()), None)


def as_safetensors(state: dict, record: dict) -> bytes:
    """The state dict as safetensors bytes: each tensor contiguous and its own (safetensors stores no shared or
    strided memory), the record as JSON strings in the metadata."""
    tensors, seen = {}, set()
    for key, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state dict entry {key!r} is a {type(tensor).__name__}, not a tensor")
        tensor = tensor.detach().cpu()
        where = tensor.untyped_storage().data_ptr() if tensor.numel() else None
        if where in seen or not tensor.is_contiguous():
            tensor = tensor.contiguous().clone()
        if where is not None:
            seen.add(where)
        tensors[key] = tensor
    metadata = {"format": "pt", "model_target": str(record["model_config"].get("_target_", "")),
                **{k: json.dumps(record[k]) for k in _JSON_KEYS}}
    return safetensors_bytes(tensors, metadata)


def read_weights(path: Path) -> dict:
    """A weights file's record, either format: {"model": state dict, "model_config", "in_shape", "num_classes",
    "step", "objective", "vocab"}."""
    if Path(path).suffix == ".safetensors":
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            state = {key: f.get_tensor(key) for key in f.keys()}
        return {"model": state, **{k: json.loads(metadata[k]) if k in metadata else None for k in _JSON_KEYS}}
    return torch.load(path, map_location="cpu", weights_only=True)
