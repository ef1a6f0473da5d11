"""When the loop writes checkpoints, and resuming one: every rank calls save (rank 0 writes a single file; for an
engine that shards them, every rank writes its shards; an engine state of tensors, each rank its own piece); the
files, their commit and the choice of which to resume are framework/checkpoints/'s."""
from __future__ import annotations

from pathlib import Path

import torch

from framework.checkpoints.disk import CheckpointNotWritten
from framework.checkpoints.position import Position
from framework.checkpoints.state import loop_state, rng_state
from framework.checkpoints.store import (BEST_DIR, CHECKPOINT_DIR, Checkpoint, keep_apart, load_checkpoint,
                                         load_engine_piece, save_checkpoint, save_sharded_checkpoint,
                                         write_engine_piece)
from framework.config.trainer import TrainerConfig
from framework.training.engine import EngineState, ProcessGroup, Wrapped
from framework.training.param_groups import group_settings


class Checkpointer:
    """Writes this run's checkpoints when due (every rank calls save; rank 0, or every rank for sharded formats,
    writes) and resumes one; remembers the newest committed one, so nothing re-reads the folder to find it."""

    def __init__(self, group: ProcessGroup, run_dir: Path, options: TrainerConfig, signature: dict, say,
                 barrier=None):
        self.group, self.say = group, say
        self.barrier = barrier or group.barrier  # the wait clock may time it
        self.folder = run_dir / CHECKPOINT_DIR
        # trainer.checkpoint_every_n_steps, keep_checkpoints; batch_size: a checkpoint's position is in samples
        self.every, self.keep = options.checkpoint_every_n_steps, options.keep_checkpoints
        self.batch_size = options.batch_size
        self.signature = signature
        self.last: Path | None = None

    def due(self, step: int, epoch_end: bool, wanted: bool = False) -> bool:
        """Whether the loop commits a checkpoint after `step`: every_n_steps, epoch ends and where the loop wants one
        (a stop, an evaluation step); never with keep=0 (trainer.keep_checkpoints=0: no checkpoints)."""
        return self.keep > 0 and (wanted or epoch_end or bool(self.every and step % self.every == 0))

    def save(self, wrapped: Wrapped, position: Position, totals: dict, callbacks: dict,
             lr_schedule: dict | None = None) -> Path:
        group, io = self.group, wrapped.checkpoint_io
        rngs = group.gather_objects(rng_state(group.cuda_devices))
        engines, pieces = self._engine_state(wrapped, position.step)
        manifest = {"step": position.step, "epoch": position.epoch, "samples_in_epoch": position.samples_in_epoch,
                    "batch_size": position.batch_size, "signature": self.signature,
                    "world_size": group.world_size, "format": io.format.name,
                    "param_groups": group_settings(wrapped.optimizer),  # names and settings, for people and tests
                    **({"engine": pieces} if pieces else {})}
        state = loop_state(position, totals, rngs, wrapped.precision.scaler, callbacks, lr_schedule, engines)
        if io.format.sharded:  # the engine writes shards on every rank
            saved = save_sharded_checkpoint(
                self.folder, state, manifest, self.keep,
                lambda folder, tag: io.save_shards(folder, tag, wrapped.model, wrapped.optimizer),
                self.barrier, group.is_main)
            self.last = saved.path
            return saved.path
        problem, path = None, None
        if group.is_main:
            try:
                path = save_checkpoint(self.folder, {**io.model_and_optimizer(wrapped.module, wrapped.optimizer),
                                                     **state}, manifest, self.keep).path
            except CheckpointNotWritten as exc:
                problem = str(exc)
        # every rank learns whether rank 0 could write it, so all stop together (not one in a collective)
        answers = group.gather_objects((problem, path))
        problems = [p for p, _ in answers if p]
        if problems:
            raise CheckpointNotWritten(problems[0])
        self.last = answers[0][1]
        return self.last

    def _engine_state(self, wrapped: Wrapped, step: int) -> tuple[list | None, dict | None]:
        """An engine's own state (ddp's PowerSGD): with tensors in it (error feedback as large as the gradients),
        each rank writes its own piece and the manifest lists them (the second value); without, it is small and goes
        into the checkpoint file, every rank's in rank order (the first). Every rank calls it."""
        if not isinstance(wrapped, EngineState):
            return None, None
        mine, group = wrapped.engine_state(), self.group
        if not _holds_tensors(mine):
            return group.gather_objects(mine), None
        problem, entry = None, None
        try:
            entry = write_engine_piece(self.folder, step, group.rank, mine)
        except CheckpointNotWritten as exc:
            problem = str(exc)
        answers = group.gather_objects((problem, entry))  # every rank learns whether every piece was written
        problems = [p for p, _ in answers if p]
        if problems:
            raise CheckpointNotWritten(problems[0])
        return None, {"holds": mine.get("holds"), "files": dict(e for _, e in answers)}

    def last_saved(self) -> Path | None:
        """This run's newest committed checkpoint: the last one it wrote, or the one it resumed from its own folder."""
        return self.last

    def keep_best(self, step: int) -> None:
        """Every rank: the checkpoint just committed for `step` becomes checkpoints/best/ (hard links: no second
        write), replacing the one kept before. Rank 0 moves the files; every rank waits for it."""
        if self.group.is_main and self.last is not None:
            try:
                keep_apart(self.last, self.folder / BEST_DIR)
            except OSError as error:  # the run goes on: its rolling checkpoints are whole, the best kept before too
                self.say(f"warning: the best checkpoint (step {step}) could not be kept apart in "
                         f"{self.folder / BEST_DIR}: {error.strerror or error}; the one kept before stays")
        self.barrier()

    def resume(self, checkpoint: Checkpoint, wrapped: Wrapped) -> tuple[Position, dict, dict, dict | None]:
        """Every rank: the state of a checkpoint the driver (or rank 0, after a restart) chose and verified:
        its position, the run totals, the callbacks' states and the lr scheduler's (None: a built-in schedule)."""
        io, scaler = wrapped.checkpoint_io, wrapped.precision.scaler
        state = load_checkpoint(checkpoint)
        if checkpoint.path.is_dir():  # sharded: the engine loads model and optimizer on every rank
            io.load_shards(checkpoint.path.parent, checkpoint.path.name, wrapped.model, wrapped.optimizer)
            position, totals = io.progress(state)
            if scaler and state.get("scaler"):
                scaler.load_state_dict(state["scaler"])
        else:
            position, totals = io.restore_file(state, wrapped.module, wrapped.optimizer, scaler)
        if checkpoint.path.parent == self.folder:
            self.last = checkpoint.path
        changes = _changes(checkpoint.manifest, position, self.group.world_size, self.batch_size)
        engine = _engine_state(wrapped, checkpoint, state.get("engine"), self.group, position.step)
        self.say(f"resumed from {checkpoint.path} (step {position.step}, epoch {position.epoch + 1}){changes}"
                 f"{'; ' + engine if engine else ''}")
        return position, totals, state.get("callbacks", {}), state.get("lr_schedule")


def _engine_state(wrapped: Wrapped, checkpoint: Checkpoint, saved: list | None, group: ProcessGroup, step: int) -> str:
    """The engine's own state back on every rank (EngineState): each rank reads its own piece where the manifest
    lists the ranks' pieces, else its entry of the list in the checkpoint file (every rank's: small, or written
    before the pieces); what it resets, in words."""
    pieces = checkpoint.manifest.get("engine")
    if pieces:
        saved_world, held = len(pieces["files"]), pieces.get("holds")
        mine = load_engine_piece(checkpoint, group.rank, group.world_size) if isinstance(wrapped, EngineState) \
            else None
    else:
        saved_world = len(saved) if saved else 0
        mine = (saved[group.rank] if saved_world == group.world_size else saved[0]) if saved else None
        held = next((state["holds"] for state in saved or [] if state and state.get("holds")), None)
    if isinstance(wrapped, EngineState):
        return wrapped.load_engine_state(mine, saved_world, group.world_size, step)
    return f"the checkpoint's {held} are not used by this engine" if held else ""


def _holds_tensors(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensors(v) for v in value.values())
    return isinstance(value, (list, tuple)) and any(_holds_tensors(v) for v in value)


def _changes(manifest: dict, position: Position, world_size: int, batch_size: int) -> str:
    """What differs from the run that saved the checkpoint, for the resume line."""
    changes = []
    saved_world = manifest.get("world_size")
    if saved_world not in (None, world_size):
        changes.append(f"saved by {saved_world} worker(s), continuing on {world_size}")
    if position.batch_size != batch_size:
        changes.append(f"global batch {position.batch_size} -> {batch_size}")
    if not changes:
        return ""
    return (f"; {', '.join(changes)}: epoch {position.epoch + 1} continues after its first "
            f"{position.samples_in_epoch} samples")
