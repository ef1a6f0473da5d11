"""Argument checks the benchmarks share: a combination that cannot work fails on the command line (argparse's error,
exit 2) instead of minutes into the first run. tests/unit/test_bench_readme.py parses every command of bench/README.md
with them."""
from __future__ import annotations

import argparse

from benchkit.commands import REPO


def names(p: argparse.ArgumentParser, flag: str, value: str, allowed) -> list[str]:
    """A comma list of names, each one of `allowed`."""
    chosen = value.split(",")
    unknown = [name for name in chosen if name not in allowed]
    if unknown:
        p.error(f"{flag}={value}: {', '.join(map(repr, unknown))} is not one of {', '.join(allowed)}")
    return chosen


def config_options(group: str) -> list[str]:
    """The options of one of train.py's config groups (conf/<group>/*.yaml)."""
    return sorted(path.stem for path in (REPO / "conf" / group).glob("*.yaml"))


def progress_window(p: argparse.ArgumentParser, warmup_steps: int, steps: int, log_every: int) -> None:
    """Steps/s are timed from the progress line that ends the warm-up to the last one: both must be printed."""
    if log_every < 1 or warmup_steps < 1 or steps < 1:
        p.error(f"--warmup-steps={warmup_steps}, --steps={steps} and --log-every={log_every} must be at least 1")
    if warmup_steps % log_every or steps % log_every:
        p.error(f"--warmup-steps={warmup_steps} and --steps={steps} must be multiples of --log-every={log_every}: "
                "steps/s are timed between the progress lines at the end of the warm-up and at the last step")

