"""One hash of a single-file checkpoint's learnt state: two runs whose digests match hold bitwise equal weights and
optimizer state (trainer.deterministic's check, on CPU workers and on a GPU)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch


def state_digest(checkpoint: Path) -> str:
    """sha256 over the model's and the optimizer's tensors of a checkpoint (their bytes and names), in key order."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    digest = hashlib.sha256()

    def add(value, path: str) -> None:
        if torch.is_tensor(value):
            digest.update(path.encode())
            digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                add(value[key], f"{path}.{key}")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                add(item, f"{path}.{i}")

    add({"model": state["model"], "optimizer": state["optimizer"]}, "")
    return digest.hexdigest()
