"""Checkpoint files on disk. A checkpoint is `step-XXXXXXXX.pt` plus its manifest `step-XXXXXXXX.json`.
The .pt is written to a temporary file, fsynced and renamed; the manifest (step, epoch, sha256 and size of the
bytes written) is written the same way afterwards and is the commit mark: no manifest, no checkpoint.
Choosing a checkpoint to resume verifies it once (size, and a streamed sha256 of the files this framework wrote);
loading uses torch.load(weights_only=True), which refuses pickles that would run code.

A strategy whose engine shards model and optimizer (fsdp's DCP, DeepSpeed ZeRO) writes a folder `step-XXXXXXXX/`
instead of the .pt: every rank's shards plus training_state.pt (ours). The manifest is still written last, by
rank 0, after every rank has finished; it lists every file with its size (a stat, not a read: no rank reads
another rank's shards), and training_state.pt with its sha256 too (hashed from the bytes rank 0 wrote). The
engine's own metadata and loader check the contents of its shards.

An engine's own state that differs per rank and is as large as the gradients (ddp's PowerSGD error feedback) is
written by each rank itself into `step-XXXXXXXX.engine/rank{r}.pt` before the commit; the manifest lists those files
(size and sha256) under "engine", and a resuming rank reads only its own (rank 0's on another world size). Without
the manifest the folder is a leftover and is pruned like one."""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from framework.checkpoints.disk import CheckpointNotWritten, remove_quietly, write_failure
from framework.common.errors import ConfigError, first_line

CHECKPOINT_DIR = "checkpoints"
BEST_DIR = "best"  # inside CHECKPOINT_DIR: the best checkpoint by the objective, apart from the rolling ones
TRAINING_STATE = "training_state.pt"  # in a sharded checkpoint's folder: everything but the engine's shards


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


def write_atomically(path: Path, data: bytes) -> None:
    """All of data at path, or (on an OSError: disk full, folder turned read-only) nothing new: the temporary file
    is taken away and the error raised."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, a read-only folder, Ctrl-C: nothing half-written stays
        remove_quietly(tmp)
        raise
    _fsync_dir(path.parent)


def serialized(obj) -> bytes:
    """torch.save's bytes, in memory: their size and sha256 go into the manifest, and write_atomically writes them."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def engine_folder(path: Path) -> Path:
    """Where the ranks' engine pieces of the checkpoint at `path` (a .pt or a shard folder) lie."""
    return path.with_suffix(".engine")


def write_engine_piece(folder: Path, step: int, rank: int, piece: dict) -> tuple[str, dict]:
    """This rank's engine state beside checkpoint `step` (before the commit): its file name and its manifest entry.
    Raises CheckpointNotWritten (nothing of the piece left) when the folder cannot take it."""
    data = serialized(piece)
    target = engine_folder(folder / f"step-{step:08d}.pt") / f"rank{rank}.pt"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, data)
    except OSError as exc:
        raise CheckpointNotWritten(write_failure(f"{target.parent.name}/{target.name}", folder, len(data), exc,
                                                 newest_valid(folder, warn=lambda m: None))) from None
    return target.name, {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def load_engine_piece(checkpoint: Checkpoint, rank: int, world_size: int) -> dict:
    """This rank's engine piece of a checkpoint whose manifest lists them (rank 0's on another world size)."""
    files = checkpoint.manifest["engine"]["files"]
    name = f"rank{rank}.pt" if len(files) == world_size else "rank0.pt"
    return torch.load(engine_folder(checkpoint.path) / name, map_location="cpu", weights_only=True)


def save_checkpoint(folder: Path, state: dict, manifest: dict, keep: int) -> Checkpoint:
    """Raises CheckpointNotWritten (with nothing of this checkpoint left on disk) when the folder cannot take it."""
    data = serialized(state)
    stem = f"step-{manifest['step']:08d}"
    path, manifest_path = folder / f"{stem}.pt", folder / f"{stem}.json"
    manifest = {**manifest, "file": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest_data = json.dumps(manifest, indent=2).encode()
    replaced = False
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(path, data)
        replaced = True
        write_atomically(manifest_path, manifest_data)
    except BaseException as exc:  # a full disk, a read-only folder; Ctrl-C or SIGTERM (raised as it) in between
        if replaced:  # a .pt without its manifest is no checkpoint (and may not match an older manifest there)
            remove_quietly(manifest_path, path)
        if not isinstance(exc, OSError):
            raise
        raise CheckpointNotWritten(write_failure(path.name, folder, len(data) + len(manifest_data), exc,
                                                 newest_valid(folder, warn=lambda m: None))) from None
    _prune(folder, keep)
    return Checkpoint(path, manifest)


def save_sharded_checkpoint(folder: Path, state: dict, manifest: dict, keep: int, write_shards: Callable[[Path, str], None],
                            barrier: Callable[[], None], is_main: bool) -> Checkpoint:
    """Every rank calls this. The engine writes each rank's shards into folder/step-XXXXXXXX/; after a barrier (every
    rank has finished its shard) rank 0 adds the loop's own state and commits the folder (commit_shards)."""
    stem = clear_shard_folder(folder, manifest["step"], is_main)
    barrier()
    write_shards(folder, stem)
    barrier()
    return commit_shards(folder, state, manifest, keep) if is_main else Checkpoint(folder / stem, {**manifest,
                                                                                                  "file": stem})


def shards_not_written(folder: Path, step: int, exc: OSError, is_main: bool, needed: int) -> CheckpointNotWritten:
    """Every rank, once the shard folder of `step` could not be written (a rank's shards: every rank learns it from
    DCP once every write has ended; rank 0's commit: rank 0 alone): rank 0 takes what was written away; the error."""
    stem = f"step-{step:08d}"
    if is_main:
        shutil.rmtree(folder / stem, ignore_errors=True)
    return CheckpointNotWritten(write_failure(stem, folder, needed, exc, newest_valid(folder, warn=lambda m: None)))


def clear_shard_folder(folder: Path, step: int, is_main: bool) -> str:
    """Rank 0, before any rank writes the shards of `step`: a folder of that step left uncommitted (or about to be
    replaced) is taken away, its manifest first. The folder's name (every rank)."""
    stem = f"step-{step:08d}"
    if is_main:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}.json").unlink(missing_ok=True)
        if (folder / stem).exists():  # never committed (or about to be replaced): not a checkpoint
            shutil.rmtree(folder / stem)
    return stem


def commit_shards(folder: Path, state: dict, manifest: dict, keep: int) -> Checkpoint:
    """Rank 0, once every rank's shards are written: the loop's own state (training_state.pt), every file fsynced,
    then the manifest (each file's size; training_state.pt's sha256) and the pruning."""
    stem = f"step-{manifest['step']:08d}"
    shard_dir = folder / stem
    try:
        data = serialized(state)
        write_atomically(shard_dir / TRAINING_STATE, data)
        ours = {TRAINING_STATE: hashlib.sha256(data).hexdigest()}
        committed = Checkpoint(shard_dir, {**manifest, "file": stem})
        files = {}
        for path in sorted(p for p in shard_dir.rglob("*") if p.is_file()):
            name = str(path.relative_to(shard_dir))
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            files[name] = {"bytes": path.stat().st_size, **({"sha256": ours[name]} if name in ours else {})}
        _fsync_dir(shard_dir)
        committed.manifest["files"] = files
        write_atomically(folder / f"{stem}.json", json.dumps(committed.manifest, indent=2).encode())
    except BaseException:  # a full disk, Ctrl-C, SIGTERM: every rank's shards are written, no rank writes there now
        remove_quietly(folder / f"{stem}.json")
        shutil.rmtree(shard_dir, ignore_errors=True)
        raise
    _prune(folder, keep)
    return committed


def keep_apart(path: Path, folder: Path) -> Checkpoint:
    """The committed checkpoint at `path` (a .pt or a shard folder) into `folder` as the only one there: its files
    hard-linked (copied where links cannot be made), its manifest last, then the one kept before taken away."""
    manifest = path.with_suffix(".json")
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        shutil.copytree(path, staging / path.name, copy_function=_link_or_copy) if path.is_dir() else \
            _link_or_copy(path, staging / path.name)
        if engine_folder(path).is_dir():
            shutil.copytree(engine_folder(path), staging / engine_folder(path).name, copy_function=_link_or_copy)
        shutil.copyfile(manifest, staging / manifest.name)
        _fsync_dir(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # a full disk leaves the best kept before, and nothing half-made
        raise
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        os.replace(folder, old)
    os.replace(staging, folder)
    shutil.rmtree(old, ignore_errors=True)
    return Checkpoint(folder / path.name, json.loads(manifest.read_text()))


def _link_or_copy(source, target) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _prune(folder: Path, keep: int) -> None:
    for old in list_checkpoints(folder)[:-keep]:
        old.path.with_suffix(".json").unlink(missing_ok=True)  # manifest first: the checkpoint is gone as a unit
        if old.path.is_dir():
            shutil.rmtree(old.path, ignore_errors=True)
        else:
            old.path.unlink(missing_ok=True)
        shutil.rmtree(engine_folder(old.path), ignore_errors=True)
    # A shard folder without a manifest, or a .tmp file, was left by a worker group that died while writing it. Pruning
    # runs right after a commit, when no rank is writing, so such a leftover is never a checkpoint in progress.
    for leftover in folder.glob("step-*"):
        if leftover.is_dir() and not leftover.with_suffix(".json").exists():
            shutil.rmtree(leftover, ignore_errors=True)
        elif leftover.suffix == ".tmp" or (leftover.suffix == ".pt" and not leftover.with_suffix(".json").exists()):
            remove_quietly(leftover)  # a file of a process killed while writing it, or before its manifest


def list_checkpoints(folder: Path) -> list[Checkpoint]:
    """Committed checkpoints (those with a manifest), oldest first. Contents are not verified here."""
    found = []
    for manifest_path in sorted(folder.glob("step-*.json")):
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            continue
        found.append(Checkpoint(manifest_path.with_name(manifest.get("file") or manifest_path.stem + ".pt"), manifest))
    return sorted(found, key=lambda c: c.step)


def verify(checkpoint: Checkpoint) -> str | None:
    """None when the file (or every file of a sharded checkpoint, and every rank's engine piece) is complete and
    matches its manifest, else what is wrong."""
    for name, expected in checkpoint.manifest.get("engine", {}).get("files", {}).items():
        problem = _verify_file(engine_folder(checkpoint.path) / name, expected)
        if problem:
            return f"{engine_folder(checkpoint.path).name}/{name}: {problem}"
    if "files" in checkpoint.manifest:
        for name, expected in checkpoint.manifest["files"].items():
            problem = _verify_file(checkpoint.path / name, expected)
            if problem:
                return f"{name}: {problem}"
        return None
    return _verify_file(checkpoint.path, checkpoint.manifest)


def _verify_file(path: Path, expected: dict) -> str | None:
    """Size first (a stat); then, where the manifest has one, the sha256, read in 4 MiB pieces."""
    try:
        size = path.stat().st_size
        if size != expected.get("bytes"):
            return f"it is truncated ({size} of {expected.get('bytes')} bytes)"
        if "sha256" not in expected:
            return None
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(4 * 2**20):
                digest.update(chunk)
    except OSError as exc:
        return f"cannot read it ({exc.strerror})"
    if digest.hexdigest() != expected["sha256"]:
        return "its checksum does not match the manifest"
    return None


def newest_valid(folder: Path, warn: Callable[[str], None] = lambda m: warnings.warn(m, stacklevel=2)) -> Checkpoint | None:
    for checkpoint in reversed(list_checkpoints(folder)):
        problem = verify(checkpoint)
        if problem is None:
            return checkpoint
        warn(f"skipping checkpoint {checkpoint.path}: {problem}; trying the one before")
    return None


def find_checkpoint(path: Path, warn: Callable[[str], None], key: str = "trainer.resume") -> Checkpoint:
    """trainer.resume=PATH: a .pt file (or a sharded checkpoint's folder), a checkpoints folder, or a run folder
    (key: the command's key that named it, e.g. eval.py's ckpt_path)."""
    if path.is_file() or (path.is_dir() and path.name and path.with_suffix(".json").is_file()):  # not . or /
        manifest_path = path.with_suffix(".json")
        if not manifest_path.is_file():
            raise ConfigError(f"{key}={path} is not allowed: it has no manifest {manifest_path.name} beside it, "
                              "so it is not a complete checkpoint of this framework")
        checkpoint = Checkpoint(path, json.loads(manifest_path.read_text()))
        problem = verify(checkpoint)
        if problem:
            raise ConfigError(f"{key}={path} is not allowed: {problem}")
        return checkpoint
    folder = path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path
    if not folder.is_dir():
        raise ConfigError(f"{key}={path} is not allowed: no such file or folder; give a checkpoint .pt, "
                          "a run folder, or auto")
    checkpoint = newest_valid(folder, warn)
    if checkpoint is None:
        raise ConfigError(f"{key}={path} is not allowed: it holds no valid checkpoint")
    return checkpoint


def load_checkpoint(checkpoint: Checkpoint) -> dict:
    """The loop's state: the whole checkpoint, or a sharded checkpoint's training_state.pt (the engine loads the rest).
    Always into CPU memory: RNG states must be CPU tensors, and load_state_dict copies weights and optimizer
    state to wherever the parameters live (a GPU-mapped load would also hold a second copy there)."""
    path = checkpoint.path / TRAINING_STATE if checkpoint.path.is_dir() else checkpoint.path
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ConfigError(
            f"checkpoint {checkpoint.path} was refused: it holds objects that would run code when loaded "
            f"(weights_only load failed: {first_line(exc)})"
        ) from exc
