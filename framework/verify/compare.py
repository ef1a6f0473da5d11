"""Two finished runs side by side, read from their folders: the loss of every step (what they logged) and every
weight at the end (weights/last.*), as differences relative to the one-process run's.

Equal means: within the tolerances at every step and in every weight tensor; or, where training amplifies rounding
(the first step agrees, later ones drift), within ROUNDING_MARGIN times the drift of one process from itself when its
float sums run in another order (a third run: framework/callbacks/other_kernels.py), measured for the same
configuration. The first step is never excused: its forward runs on the same weights and samples, before any update
could amplify anything."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from framework.common.errors import ConfigError
from framework.results.run_scalars import run_scalars
from framework.results.trained_model import read_trained

LOSS_TAG = "loss/train"
ROUNDING_MARGIN = 10  # an order of magnitude: rounding in another order drifts by a like amount, not the same one


@dataclass
class Drift:
    """How far one process drifts from itself with its sums in another order: the largest loss and weight gaps."""

    run: Path
    loss: float
    weights: float


@dataclass
class Comparison:
    """One process's run against the strategy's: the loss of each step in both, the largest relative differences and
    where they are, and the rounding drift of one process when it was measured."""

    one_process: Path
    strategy: Path
    steps: list[int]
    one_losses: list[float]
    strategy_losses: list[float]
    loss_tolerance: float
    weight_tolerance: float
    weight_gap: float  # the largest over the weight tensors of |difference| / |one process's tensor| (norms)
    worst_weight: str  # that tensor's key
    drift: Drift | None = None

    @property
    def loss_gaps(self) -> list[float]:
        return [relative(a, b) for a, b in zip(self.one_losses, self.strategy_losses)]

    @property
    def loss_gap(self) -> float:
        return max(self.loss_gaps, default=0.0)

    @property
    def within_tolerances(self) -> bool:
        return self.loss_gap <= self.loss_tolerance and self.weight_gap <= self.weight_tolerance

    @property
    def first_step_agrees(self) -> bool:
        return bool(self.loss_gaps) and self.loss_gaps[0] <= self.loss_tolerance

    @property
    def needs_drift(self) -> bool:
        """Whether one process's own drift decides: the first step agrees, a later one or the weights do not."""
        return not self.within_tolerances and self.first_step_agrees and self.drift is None

    @property
    def within_drift(self) -> bool:
        d = self.drift
        return (d is not None and self.first_step_agrees
                and self.loss_gap <= max(self.loss_tolerance, ROUNDING_MARGIN * d.loss)
                and self.weight_gap <= max(self.weight_tolerance, ROUNDING_MARGIN * d.weights))

    @property
    def equal(self) -> bool:
        return self.within_tolerances or self.within_drift

    @property
    def first_differing_step(self) -> int | None:
        return next((s for s, gap in zip(self.steps, self.loss_gaps) if gap > self.loss_tolerance), None)

    def gaps_text(self) -> str:
        said = f"loss {self.loss_gap:.1e}, weights {self.weight_gap:.1e} relative at most"
        if self.drift is not None and not self.within_tolerances:
            said += (f"; one process drifts from itself by loss {self.drift.loss:.1e}, weights "
                     f"{self.drift.weights:.1e} with its sums in another order")
        return said

    def difference_text(self, name: str) -> str:
        """Where the runs part: the first step whose loss differs, or the weights when every loss agrees."""
        step = self.first_differing_step
        weights = (f"weights {self.weight_gap:.1e} relative at most ({self.worst_weight}; "
                   f"verify.weight_tolerance={self.weight_tolerance:g})")
        if step is None:
            said = f"{name}'s loss agrees at every step, but its weights differ at the end: {weights}"
        else:
            i = self.steps.index(step)
            said = (f"{name} differs from one process from step {step} on: loss {self.strategy_losses[i]:.6f} "
                    f"against {self.one_losses[i]:.6f} ({self.loss_gaps[i]:.1e} relative; verify.loss_tolerance="
                    f"{self.loss_tolerance:g}); {weights}")
        if self.drift is not None:
            said += (f"; more than {ROUNDING_MARGIN} times one process's own drift with its sums in another order "
                     f"(loss {self.drift.loss:.1e}, weights {self.drift.weights:.1e})")
        return said

    def table(self, name: str, most: int = 30) -> list[str]:
        """The losses step by step (the first and last rows of a long run)."""
        rows = list(zip(self.steps, self.one_losses, self.strategy_losses, self.loss_gaps))
        if len(rows) > most:
            rows = rows[:most - 5] + [None] + rows[-5:]
        width = max(len(name), 12)
        lines = [f"  {'step':>5}  {'one process':>12}  {name:>{width}}  {'relative':>9}"]
        for row in rows:
            if row is None:
                lines.append(f"  {'...':>5}")
                continue
            step, one, other, gap = row
            mark = "  <- differs" if gap > self.loss_tolerance else ""
            lines.append(f"  {step:>5}  {one:>12.6f}  {other:>{width}.6f}  {gap:>9.1e}{mark}")
        return lines

    def to_json(self) -> dict:
        drift = None if self.drift is None else {"run": str(self.drift.run), "loss_gap": self.drift.loss,
                                                   "weight_gap": self.drift.weights}
        return {"one_process": str(self.one_process), "strategy": str(self.strategy), "equal": self.equal,
                "loss_gap": self.loss_gap, "weight_gap": self.weight_gap, "worst_weight": self.worst_weight,
                "first_differing_step": self.first_differing_step, "one_process_drift": drift,
                "steps": [{"step": s, "one_process": a, "strategy": b, "relative": g}
                          for s, a, b, g in zip(self.steps, self.one_losses, self.strategy_losses, self.loss_gaps)]}


def relative(reference: float, other: float) -> float:
    return abs(other - reference) / max(abs(reference), 1e-12)


def compare_runs(one_process: Path, strategy: Path, loss_tolerance: float, weight_tolerance: float) -> Comparison:
    one, other = step_losses(one_process), step_losses(strategy)
    if sorted(one) != sorted(other):
        raise ConfigError(f"{strategy} logged the loss at steps {sorted(other)}, one process at {sorted(one)}: the "
                          "runs trained different numbers of steps")
    steps = sorted(one)
    gap, worst = weight_difference(final_weights(one_process), final_weights(strategy))
    return Comparison(one_process, strategy, steps, [one[s] for s in steps], [other[s] for s in steps],
                      loss_tolerance, weight_tolerance, gap, worst)


def drift_of(one_process: Path, again: Path) -> Drift:
    """One process against itself with its sums in another order."""
    one, other = step_losses(one_process), step_losses(again)
    gap, _ = weight_difference(final_weights(one_process), final_weights(again))
    return Drift(again, max((relative(one[s], other[s]) for s in one if s in other), default=0.0), gap)


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
