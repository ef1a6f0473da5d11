"""Why a run failed, kept in its folder: the `error:` line the console showed, appended to its train.log, where a
sweep's summary finds it for the job's row (framework/results/sweep_summary.py). A job refused in its driver has
no other trace: its train.log would be empty and its row would say only that it failed."""
from __future__ import annotations

from pathlib import Path

LOG = "train.log"
PREFIX = "error: "


def note_failure(run_dir: Path, reason: BaseException | str) -> None:
    """The reason, as one line, at the end of the run folder's train.log. Not kept where the folder cannot be
    written (a full disk): the console has said it already, and that failure is not hidden behind this one."""
    line = " ".join(str(reason).split())
    try:
        with open(Path(run_dir) / LOG, "a") as log:
            log.write(f"{PREFIX}{line}\n")
    except OSError:
        pass


def failure_of(run_dir: Path) -> str | None:
    """The last reason noted in the run folder's train.log, or None."""
    try:
        lines = (Path(run_dir) / LOG).read_text(errors="replace").splitlines()
    except OSError:
        return None
    return next((line[len(PREFIX):] for line in reversed(lines) if line.startswith(PREFIX)), None)
