"""Checkpoint files on disk. A checkpoint is `step-XXXXXXXX.pt` plus its manifest `step-XXXXXXXX.json`.
The .pt is written to a temporary file, fsynced and renamed; the manifest (step, epoch, config hash,
sha256, size) is written the same way afterwards and is the commit mark: no manifest, no checkpoint.
Loading verifies size and checksum and uses torch.load(weights_only=True), which refuses pickles that
would run code."""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from framework.errors import ConfigError

CHECKPOINT_DIR = "checkpoints"


@dataclass
class Checkpoint:
    path: Path
    manifest: dict

    @property
    def step(self) -> int:
        return self.manifest["step"]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, data: bytes, midway: Callable[[], None] | None = None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        half = len(data) // 2
        f.write(data[:half])
        if midway:  # fault-injection point: the process may die with the file half written
            f.flush()
            midway()
        f.write(data[half:])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_checkpoint(folder: Path, state: dict, manifest: dict, keep: int,
                    midway: Callable[[], None] | None = None) -> Checkpoint:
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    stem = f"step-{manifest['step']:08d}"
    path = folder / f"{stem}.pt"
    manifest = {**manifest, "file": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _write_atomically(path, data, midway)
    _write_atomically(folder / f"{stem}.json", json.dumps(manifest, indent=2).encode())
    _prune(folder, keep)
    return Checkpoint(path, manifest)


def _prune(folder: Path, keep: int) -> None:
    for old in list_checkpoints(folder)[:-keep]:
        old.path.with_suffix(".json").unlink(missing_ok=True)  # manifest first: the checkpoint is gone as a unit
        old.path.unlink(missing_ok=True)


def list_checkpoints(folder: Path) -> list[Checkpoint]:
    """Committed checkpoints (those with a manifest), oldest first. Contents are not verified here."""
    found = []
    for manifest_path in sorted(folder.glob("step-*.json")):
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            continue
        found.append(Checkpoint(manifest_path.with_suffix(".pt"), manifest))
    return sorted(found, key=lambda c: c.step)


def verify(checkpoint: Checkpoint) -> str | None:
    """None when the file is complete and matches its manifest, else what is wrong."""
    try:
        data = checkpoint.path.read_bytes()
    except OSError as exc:
        return f"cannot read it ({exc.strerror})"
    if len(data) != checkpoint.manifest.get("bytes"):
        return f"it is truncated ({len(data)} of {checkpoint.manifest.get('bytes')} bytes)"
    if hashlib.sha256(data).hexdigest() != checkpoint.manifest.get("sha256"):
        return "its checksum does not match the manifest"
    return None


def newest_valid(folder: Path, warn: Callable[[str], None] = lambda m: warnings.warn(m, stacklevel=2)) -> Checkpoint | None:
    for checkpoint in reversed(list_checkpoints(folder)):
        problem = verify(checkpoint)
        if problem is None:
            return checkpoint
        warn(f"skipping checkpoint {checkpoint.path}: {problem}; trying the one before")
    return None


def find_checkpoint(path: Path, warn: Callable[[str], None]) -> Checkpoint:
    """trainer.resume=PATH: a .pt file, a checkpoints folder, or a run folder."""
    if path.is_file():
        manifest_path = path.with_suffix(".json")
        if not manifest_path.is_file():
            raise ConfigError(f"trainer.resume={path} is not allowed: it has no manifest {manifest_path.name} beside it, "
                              "so it is not a complete checkpoint of this framework")
        checkpoint = Checkpoint(path, json.loads(manifest_path.read_text()))
        problem = verify(checkpoint)
        if problem:
            raise ConfigError(f"trainer.resume={path} is not allowed: {problem}")
        return checkpoint
    folder = path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path
    if not folder.is_dir():
        raise ConfigError(f"trainer.resume={path} is not allowed: no such file or folder; give a checkpoint .pt, "
                          "a run folder, or auto")
    checkpoint = newest_valid(folder, warn)
    if checkpoint is None:
        raise ConfigError(f"trainer.resume={path} is not allowed: it holds no valid checkpoint")
    return checkpoint


def load_checkpoint(checkpoint: Checkpoint, map_location) -> dict:
    try:
        return torch.load(checkpoint.path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ConfigError(
            f"checkpoint {checkpoint.path} was refused: it holds objects that would run code when loaded "
            f"(weights_only load failed: {str(exc).splitlines()[0]})"
        ) from exc
