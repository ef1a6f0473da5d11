"""What the W&B logger (logger=wandb) shares between a run, its ranks and its sweep: the optional extra and its
one-line refusal, the run id kept in the run folder (a resumed run goes on in the same W&B run), the group a sweep's
jobs share (its name kept in the sweep folder, for any launcher), and where W&B writes its files."""
from __future__ import annotations

import os
import secrets
import string
from pathlib import Path

from framework.common.errors import ConfigError
from framework.config.extras import missing_line, require_extra

RUN_ID_FILE = "wandb_run_id"
SWEEP_GROUP_FILE = "wandb_group"
MISSING = missing_line("wandb", "logger=wandb")
_ID_LETTERS = string.ascii_lowercase + string.digits


def require_wandb() -> None:
    require_extra("wandb", "logger=wandb")


def wandb_module():
    # an optional extra, and seconds of imports: only the ranks that log import it
    try:
        import wandb  # optional extra
    except ImportError:
        raise ConfigError(MISSING) from None
    return wandb


def run_id(run_dir: Path) -> str:
    """The W&B run id of this run folder: the one kept there (a resumed run), else a new one, kept."""
    kept = run_dir / RUN_ID_FILE
    if kept.is_file():
        return kept.read_text().strip()
    new = "".join(secrets.choice(_ID_LETTERS) for _ in range(8))
    partial = kept.with_suffix(".partial")
    partial.write_text(new)
    partial.replace(kept)
    return new


def sweep_group(run_dir: Path) -> str | None:
    """The group of the sweep run_dir is a job of, when that sweep logs to W&B (framework/results/wandb_sweep.py)."""
    marker = run_dir.parent / SWEEP_GROUP_FILE
    return marker.read_text().strip() if marker.is_file() else None


def files_dir(configured: str | None, run_dir: Path) -> str:
    """Where W&B writes its files: the configured folder, else $WANDB_DIR, else the run folder."""
    return configured or os.environ.get("WANDB_DIR") or str(run_dir)
