"""Two finished runs side by side, read from their folders: the loss of every step (what they logged) and every
weight at the end (weights/last.*), as differences relative to the one-process run's (the verdict on them:
framework/verify/verdict.py)."""
from __future__ import annotations

from pathlib import Path

from framework.common.errors import ConfigError
from framework.results.run_scalars import run_scalars
from framework.results.trained_model import read_trained
from framework.verify.verdict import Comparison, Floor, relative

LOSS_TAG = "loss/train"


def compare_runs(one_process: Path, strategy: Path, loss_tolerance: float, weight_tolerance: float) -> Comparison:
    steps, one, other = side_by_side(one_process, strategy)
    gap, worst = weight_difference(final_weights(one_process), final_weights(strategy))
    return Comparison(one_process, strategy, steps, one, other, loss_tolerance, weight_tolerance, gap, worst)


def floor_of(one_process: Path, floor_run: Path, what: str) -> Floor:
    """One process against its floor's run (framework/verify/floor.py), step by step."""
    _, one, other = side_by_side(one_process, floor_run)
    gap, _ = weight_difference(final_weights(one_process), final_weights(floor_run))
    return Floor(floor_run, what, [relative(a, b) for a, b in zip(one, other)], gap)


def side_by_side(one_process: Path, other: Path) -> tuple[list[int], list[float], list[float]]:
    """The steps both logged, and each one's loss in both runs."""
    one, theirs = step_losses(one_process), step_losses(other)
    if sorted(one) != sorted(theirs):
        raise ConfigError(f"{other} logged the loss at steps {sorted(theirs)}, one process at {sorted(one)}: the "
                          "runs trained different numbers of steps")
    steps = sorted(one)
    return steps, [one[s] for s in steps], [theirs[s] for s in steps]


def step_losses(run_dir: Path) -> dict[int, float]:
    losses = run_scalars(run_dir).get(LOSS_TAG)
    if not losses:
        raise ConfigError(f"{run_dir} logged no {LOSS_TAG}: verify.py reads every step's loss from the run's "
                          "TensorBoard events or metrics.csv (logger=tensorboard or logger=csv)")
    return losses


def final_weights(run_dir: Path) -> dict:
    return read_trained(run_dir, "last")["model"]


def weight_difference(reference: dict, other: dict) -> tuple[float, str]:
    """The largest relative difference of a floating-point tensor of the two state dicts, and its key; a key only
    one of them has is infinitely different."""
    worst, where = 0.0, ""
    for key in sorted(set(reference) | set(other)):
        a, b = reference.get(key), other.get(key)
        if a is None or b is None or a.shape != b.shape:
            return float("inf"), key
        if not a.is_floating_point():
            continue
        a, b = a.double(), b.double()
        gap = float((a - b).norm() / a.norm()) if a.norm() > 0 else float((a - b).norm())
        if gap > worst or not where:
            worst, where = gap, key
    return worst, where
