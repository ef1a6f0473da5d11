"""Reading what a run left in its folder: its job folders, TensorBoard's scalars (with TensorBoard's own reader), the
loss curve, and the comparisons the engines' tests make with it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest


def walk(root: Path, pattern: str = "*") -> list[Path]:
    """root.rglob(pattern), sorted, while a run may be writing there: a folder it renames or removes during the walk
    (checkpoints/best.tmp, an older checkpoint pruned) means walk again. Every walk of a live run folder goes here."""
    while True:
        try:
            return sorted(root.rglob(pattern)) if root.exists() else []
        except FileNotFoundError:
            continue


def run_dirs(root: Path) -> list[Path]:
    """Every Hydra job folder under root/outputs (a folder with a .hydra subfolder), in order."""
    return sorted(p.parent for p in walk(root / "outputs", ".hydra"))


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def losses_by_step(run_dir: Path) -> dict[int, float]:
    """loss/train by step; after a restart the redone steps appear again and the last value wins."""
    return dict(read_scalars(run_dir)["loss/train"])


def assert_curves_match(reference: list[tuple[int, float]], other: list[tuple[int, float]], rel: float,
                        names: tuple[str, str]) -> None:
    """Step by step (paired in order), other's loss is within rel of reference's."""
    assert len(reference) == len(other), f"{names[0]} logged {len(reference)} steps, {names[1]} {len(other)}"
    for (step, a), (_, b) in zip(reference, other):
        assert abs(a - b) <= rel * abs(a), f"step {step}: {names[0]} {a} vs {names[1]} {b}"


def assert_same_losses(reference: dict[int, float], other: dict[int, float], steps, rel: float,
                       names: tuple[str, str]) -> None:
    """At each of `steps`, other's loss is within rel of reference's (both by step)."""
    for step in steps:
        assert abs(other[step] - reference[step]) <= rel * abs(reference[step]), (
            f"step {step}: {names[0]} {reference[step]} vs {names[1]} {other[step]}")


def assert_resumed_from(out: str, step: int) -> None:
    """The run said it resumed from the checkpoint of `step` (a single-file checkpoint is step-N.pt, a sharded one
    the folder step-N)."""
    assert "resumed from" in out and re.search(rf"step-{step:08d}(\.pt)? \(step {step}\b", out), out


def assert_continues(reference: Path, run_dir: Path, steps: int, resumed_from: int, rel: float = 1e-6) -> None:
    """run_dir logged every step 1..steps with the reference run's loss (within rel; a looser rel compares only the
    steps after the resume: a GPU's kernels may sum in another order, and a restart from scratch would be far off)."""
    expected, got = losses_by_step(reference), losses_by_step(run_dir)
    assert sorted(got) == list(range(1, steps + 1))
    for step in expected if rel <= 1e-6 else range(resumed_from + 1, steps + 1):
        assert got[step] == pytest.approx(expected[step], rel=rel), f"step {step}"
