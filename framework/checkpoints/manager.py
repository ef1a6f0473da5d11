"""When to write checkpoints and which one to resume from; the trainer calls it, rank 0 writes."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from framework.checkpoints.state import Position, capture, config_hash, restore_progress, rng_state
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
        self.signature, self.config_hash = signature, config_hash(cfg)

    def due(self, step: int, epoch_end: bool) -> bool:
        return epoch_end or bool(self.every and step % self.every == 0)

    def save(self, model, optimizer, scaler, position: Position, totals: dict, tb) -> None:
        strategy = self.strategy
        rngs = strategy.gather_objects(rng_state(strategy.cuda_devices()))
        if tb:
            tb.flush()  # everything logged up to this step is on disk before the checkpoint exists
        manifest = {"step": position.step, "epoch": position.epoch, "batch_in_epoch": position.batch_in_epoch,
                    "config_hash": self.config_hash, "signature": self.signature,
                    "world_size": strategy.world_size, "format": strategy.checkpoint_format}
        midway = None
        if self.faults.due("kill_in_checkpoint", position.step):
            def midway():
                self.faults.kill_if_due("kill_in_checkpoint", position.step)
        if strategy.checkpoint_format != "file":  # the engine writes shards on every rank
            state = {"position": asdict(position), "totals": totals, "rng": rngs, "scaler": None}
            save_sharded_checkpoint(self.folder, state, manifest, self.keep,
                                    lambda folder, tag: strategy.save_engine_checkpoint(folder, tag, model),
                                    strategy.barrier, strategy.is_main, midway)
            return
        if not strategy.is_main:
            return
        state = capture(strategy.unwrap(model), optimizer, scaler, position, totals, rngs)
        save_checkpoint(self.folder, state, manifest, self.keep, midway)

    def last_saved(self) -> Path | None:
        """This run's newest committed checkpoint (rank 0 wrote it; every rank can read the folder)."""
        found = newest_valid(self.folder, warn=lambda m: None)
        return found.path if found else None

    def resume(self, checkpoint: Checkpoint, model, optimizer, scaler) -> tuple[Position, dict]:
        state = load_checkpoint(checkpoint)
        strategy = self.strategy
        if checkpoint.path.is_dir():  # sharded: the engine loads model and optimizer on every rank
            strategy.load_engine_checkpoint(checkpoint.path.parent, checkpoint.path.name, model)
            position, totals = restore_progress(state, strategy.rank, strategy.cuda_devices())
        else:
            position, totals = strategy.restore_file_checkpoint(state, model, optimizer, scaler)
        self.say(f"resumed from {checkpoint.path} (step {position.step}, epoch {position.epoch + 1})")
        return position, totals
