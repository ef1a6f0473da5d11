"""The scalars a run logged, read back from its folder by step: TensorBoard's event files (logger=tensorboard, the
default), else metrics.csv (logger=csv). What verify.py compares and the scaling report sums up are the runs' own
records, not numbers passed around beside them."""
from __future__ import annotations

import csv
import logging
from pathlib import Path

METRICS_FILE = "metrics.csv"  # logger=csv's file (framework/callbacks/csv_log.py)
EVENT_FILES = "events.out.tfevents.*"


def run_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value}; a step logged again after a resume keeps its last value. Empty when the run logged
    neither TensorBoard events nor metrics.csv."""
    run_dir = Path(run_dir)
    if any(run_dir.glob(EVENT_FILES)):
        return _tensorboard(run_dir)
    if (run_dir / METRICS_FILE).is_file():
        return _csv(run_dir / METRICS_FILE)
    return {}


def _tensorboard(run_dir: Path) -> dict[str, dict[int, float]]:
    # tensorboard's reader takes a second or two to import: only a command that reads event files pays for it
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    quiet = logging.getLogger("tensorboard")  # its reader says at INFO where each event file ends
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        events.Reload()
    finally:
        quiet.setLevel(level)
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def _csv(path: Path) -> dict[str, dict[int, float]]:
    found: dict[str, dict[int, float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            found.setdefault(row["metric"], {})[int(row["step"])] = float(row["value"])
    return found
