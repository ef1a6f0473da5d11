"""Which checkpoint a run resumes from (framework/training/checkpointing.py writes and resumes them)."""
from __future__ import annotations

from pathlib import Path

from framework.checkpoints.store import CHECKPOINT_DIR, Checkpoint, find_checkpoint, newest_valid
from framework.session.environment import restart_attempt


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
