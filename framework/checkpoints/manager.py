"""When to write checkpoints and which one to resume from; the trainer calls it, rank 0 writes."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from framework.checkpoints.disk import CheckpointNotWritten
from framework.checkpoints.position import Position
from framework.checkpoints.state import capture, restore_progress, rng_state
from framework.checkpoints.store import (CHECKPOINT_DIR, Checkpoint, find_checkpoint, load_checkpoint, newest_valid,
                                         save_checkpoint, save_sharded_checkpoint)
from framework.launch.environment import restart_attempt


def choose_checkpoint(resume: str | None, run_dir: Path, warn) -> Checkpoint | None:
    """The run's own newest valid checkpoint first (resume=auto, or a restarted worker group),
    then an explicit trainer.resume=PATH; None starts fresh."""
    resume = None if resume in (None, "none") else str(resume)
    if resume == "auto" or restart_attempt() > 0:
        own = newest_valid(run_dir / CHECKPOINT_DIR, warn)
        if own is not None:
            return own
    if resume and resume != "auto":
        return find_checkpoint(Path(resume), warn)
    return None


class Checkpointer:
    def __init__(self, cfg, strategy, run_dir: Path, signature: dict, faults, say):
        self.cfg, self.strategy, self.faults, self.say = cfg, strategy, faults, say
        self.folder = run_dir / CHECKPOINT_DIR
        self.every = cfg.trainer.checkpoint_every_n_steps
        self.keep = cfg.trainer.keep_checkpoints
        self.signature = signature

    def due(self, step: int, epoch_end: bool) -> bool:
        return epoch_end or bool(self.every and step % self.every == 0)

    def save(self, model, optimizer, scaler, position: Position, totals: dict, tb) -> None:
        strategy = self.strategy
        rngs = strategy.gather_objects(rng_state(strategy.cuda_devices()))
        if tb:
            tb.flush()  # everything logged up to this step is on disk before the checkpoint exists
        manifest = {"step": position.step, "epoch": position.epoch, "samples_in_epoch": position.samples_in_epoch,
                    "batch_size": position.batch_size, "signature": self.signature,
                    "world_size": strategy.world_size, "format": strategy.checkpoint_format}
        midway = None
        if self.faults.due("kill_in_checkpoint", position.step):
            midway = lambda: self.faults.kill_if_due("kill_in_checkpoint", position.step)  # noqa: E731
        if strategy.checkpoint_format != "file":  # the engine writes shards on every rank
            state = {"position": asdict(position), "totals": totals, "rng": rngs, "scaler": None}
            save_sharded_checkpoint(self.folder, state, manifest, self.keep,
                                    lambda folder, tag: strategy.save_engine_checkpoint(folder, tag, model),
                                    strategy.barrier, strategy.is_main, midway)
            return
        problem = None
        if strategy.is_main:
            state = capture(strategy.unwrap(model), optimizer, scaler, position, totals, rngs)
            try:
                save_checkpoint(self.folder, state, manifest, self.keep, midway)
            except CheckpointNotWritten as exc:
                problem = str(exc)
        # every rank learns whether rank 0 could write it, so all stop together (not one in a collective)
        problems = [p for p in strategy.gather_objects(problem) if p]
        if problems:
            raise CheckpointNotWritten(problems[0])

    def last_saved(self) -> Path | None:
        """This run's newest committed checkpoint (rank 0 wrote it; every rank can read the folder)."""
        found = newest_valid(self.folder, warn=lambda m: None)
        return found.path if found else None

    def resume(self, checkpoint: Checkpoint, model, optimizer, scaler) -> tuple[Position, dict]:
        state = load_checkpoint(checkpoint)
        strategy, batch = self.strategy, self.cfg.trainer.batch_size
        where = (strategy.rank, strategy.world_size, batch, strategy.cuda_devices())
        if checkpoint.path.is_dir():  # sharded: the engine loads model and optimizer on every rank
            strategy.load_engine_checkpoint(checkpoint.path.parent, checkpoint.path.name, model)
            position, totals = restore_progress(state, *where)
        else:
            position, totals = strategy.restore_file_checkpoint(state, model, optimizer, scaler)
        changes = _changes(checkpoint.manifest, position, strategy.world_size, batch)
        self.say(f"resumed from {checkpoint.path} (step {position.step}, epoch {position.epoch + 1}){changes}")
        return position, totals


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
