"""When the loop writes checkpoints, and resuming one: every rank calls save (rank 0 writes a single file; for an
engine that shards them, every rank writes its shards; an engine state of tensors, each rank its own piece); the
files, their commit and the choice of which to resume are framework/checkpoints/'s."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from framework.checkpoints.disk import CheckpointNotWritten, tensor_bytes
from framework.checkpoints.position import Position
from framework.checkpoints.state import loop_state, rng_state
from framework.checkpoints.store import (BEST_DIR, CHECKPOINT_DIR, Checkpoint, clear_shard_folder, commit_shards,
                                         keep_apart, load_checkpoint, load_engine_piece, save_checkpoint,
                                         save_sharded_checkpoint, shards_not_written, write_engine_piece)
from framework.config.trainer import TrainerConfig
from framework.data.batches import leaves
from framework.training.async_save import CheckpointWrites, dcp_stager, pinned, staged
from framework.training.dcp import DcpWrites, written
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
        self.writes = CheckpointWrites(behind=options.async_checkpoint)
        self._committed: list[tuple[int, Path]] = []
        self._dcp_writer: DcpWrites | None = None

    def due(self, step: int, epoch_end: bool, wanted: bool = False) -> bool:
        """Whether the loop commits a checkpoint after `step`: every_n_steps, epoch ends and where the loop wants one
        (a stop, an evaluation step); never with keep=0 (trainer.keep_checkpoints=0: no checkpoints)."""
        return self.keep > 0 and (wanted or epoch_end or bool(self.every and step % self.every == 0))

    def save(self, wrapped: Wrapped, position: Position, totals: dict, callbacks: dict,
             lr_schedule: dict | None = None) -> Path | None:
        """Every rank: the checkpoint of position.step, once the one before it is committed (at most one write in
        flight). Its path once committed here (a blocking save), None while it is written behind the loop
        (trainer.async_checkpoint): committed() says when it was. Raises CheckpointNotWritten, on every rank, when
        this one, or the one written behind before it, could not be written."""
        self._settle()
        group, io = self.group, wrapped.checkpoint_io
        rngs = group.gather_objects(rng_state(group.cuda_devices))
        engines, pieces = self._engine_state(wrapped, position.step)
        manifest = {"step": position.step, "epoch": position.epoch, "samples_in_epoch": position.samples_in_epoch,
                    "batch_size": position.batch_size, "signature": self.signature,
                    "world_size": group.world_size, "format": io.format.name,
                    "param_groups": group_settings(wrapped.optimizer),  # names and settings, for people and tests
                    **({"engine": pieces} if pieces else {})}
        state = loop_state(position, totals, rngs, wrapped.precision.scaler, callbacks, lr_schedule, engines)
        self.writes.start(position.step, self._write(wrapped, state, manifest))
        if not self.writes.behind:
            self._settle()
            return self.last
        return None

    def _write(self, wrapped: Wrapped, state: dict, manifest: dict) -> Callable[[], Path | None]:
        """This rank's part of the checkpoint, as a call that writes and commits it (the state staged first where it
        is written behind the loop: framework/training/async_save.py)."""
        io, is_main, pin = wrapped.checkpoint_io, self.group.is_main, pinned(bool(self.group.cuda_devices))
        if io.format.sharded and self.writes.behind:  # DCP: staged and sent by async_save, committed by rank 0
            stem = clear_shard_folder(self.folder, manifest["step"], is_main)
            self.barrier()
            shards = self._dcp().async_save(io.shard_state(wrapped.model, wrapped.optimizer), self.folder / stem)
            state = staged(state, pin) if is_main else None

            def sharded() -> Path | None:
                try:
                    written(shards)  # rank 0's returns once every rank's shards and DCP's metadata are written
                    return commit_shards(self.folder, state, manifest, self.keep).path if is_main else None
                except OSError as exc:
                    raise self._shards_not_written(wrapped, manifest["step"], exc) from None
            return sharded
        if io.format.sharded:
            def blocking() -> Path | None:
                try:
                    return save_sharded_checkpoint(
                        self.folder, state, manifest, self.keep,
                        lambda folder, tag: io.save_shards(folder, tag, wrapped.model, wrapped.optimizer),
                        self.barrier, is_main).path
                except OSError as exc:
                    if io.format.name != "dcp":  # DeepSpeed's own writer: its error as it comes
                        raise
                    raise self._shards_not_written(wrapped, manifest["step"], exc) from None
            return blocking
        if not is_main:
            return lambda: None
        whole = {**io.model_and_optimizer(wrapped.module, wrapped.optimizer), **state}
        whole = staged(whole, pin) if self.writes.behind else whole
        return lambda: save_checkpoint(self.folder, whole, manifest, self.keep).path

    def _shards_not_written(self, wrapped: Wrapped, step: int, exc: OSError) -> CheckpointNotWritten:
        """A DCP shard folder that could not be written (disk full, folder read-only): nothing of it stays; what it
        needed is about the model's and the optimizer's state (DTensors count whole: no collective here)."""
        needed = tensor_bytes(wrapped.model.state_dict()) + tensor_bytes(wrapped.optimizer.state_dict()["state"])
        return shards_not_written(self.folder, step, exc, self.group.is_main, needed)

    def _dcp(self):
        """async_save's gloo group and stager, made once, by every rank together, at the first save."""
        if self._dcp_writer is None:
            self._dcp_writer = DcpWrites(dcp_stager(bool(self.group.cuda_devices)))
        return self._dcp_writer

    def _settle(self) -> None:
        """Every rank: waits for this rank's write in flight, then every rank learns whether every rank's was
        written; its commit is remembered (committed()), a failure raised, in one line, on every rank."""
        outcome = self.writes.wait()
        if outcome is None:  # every rank started the same saves: none is in flight anywhere
            return
        answers = self.group.gather_objects((outcome.problem, outcome.explained, outcome.path))
        failed = [(rank, problem, explained) for rank, (problem, explained, _) in enumerate(answers) if problem]
        if failed:
            rank, problem, explained = failed[0]
            if not self.writes.behind:
                raise CheckpointNotWritten(problem)
            kept = "" if explained else f"; it was not committed, and {self.last} stays the newest checkpoint" \
                if self.last else "; it was not committed, and no checkpoint of this run was"
            raise CheckpointNotWritten(f"rank {rank}, step {outcome.step} (written behind the loop, "
                                       f"trainer.async_checkpoint): {problem}{kept}")
        self.last = answers[0][2]
        self._committed.append((outcome.step, self.last))

    def committed(self) -> list[tuple[int, Path]]:
        """The (step, path) of each checkpoint committed since the last call, oldest first."""
        done, self._committed = self._committed, []
        return done

    def finish(self) -> None:
        """Every rank, at the end of the run: the write in flight committed (or its failure raised)."""
        self._settle()
        self.close()

    def abandon(self) -> str | None:
        """This rank alone, when the run ends with an error or a stop: waits for its write in flight to end (its
        commit stays, or its temporary files are gone), no collective. What became of it, in one line, or None."""
        outcome = self.writes.wait()
        self.close()
        if outcome is None or outcome.problem is None:
            self.last = outcome.path if outcome and outcome.path else self.last
            return None
        return f"the checkpoint of step {outcome.step} was not committed: {outcome.problem}"

    def close(self) -> None:
        if self._dcp_writer is not None:
            self._dcp_writer.close()
            self._dcp_writer = None

    def _engine_state(self, wrapped: Wrapped, step: int) -> tuple[list | None, dict | None]:
        """An engine's own state (ddp's PowerSGD): with tensors in it (error feedback as large as the gradients),
        each rank writes its own piece and the manifest lists them (the second value); without, it is small and goes
        into the checkpoint file, every rank's in rank order (the first). Every rank calls it."""
        if not isinstance(wrapped, EngineState):
            return None, None
        mine, group = wrapped.engine_state(), self.group
        if not leaves(mine):
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
        write), replacing the one kept before. Rank 0 moves the files; every rank waits for it (and first for the
        checkpoint, where it is written behind the loop)."""
        self._settle()
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
