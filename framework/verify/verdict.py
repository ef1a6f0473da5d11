"""The verdict on two runs' numbers: one process's against the strategy's, step by step, with the rounding floor
once it was measured (framework/verify/compare.py reads the numbers from the run folders).

Equal means: within the tolerances at every step and in every weight tensor; or, where training amplifies rounding
(the first step agrees, later ones drift), within ROUNDING_MARGIN times the rounding floor: how far one process
drifts from itself when only the order of its float sums changes (a third run, framework/verify/floor.py), step by
step. The first step is never excused: its forward runs on the same weights and samples, before any update could
amplify anything.

The floor also says where the comparison stops meaning anything. Once rounding alone carries one process further
from itself than verify.loss_tolerance, a difference of the runs can no longer be told from rounding: from that step
on the verdict is "cannot tell", not "equal" (and the weights at the end are not judged either)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

ROUNDING_MARGIN = 10  # an order of magnitude: rounding in another order drifts by a like amount, not the same one
EQUAL, NOT_EQUAL, CANNOT_TELL = "equal", "not_equal", "cannot_tell"


@dataclass
class Floor:
    """One process against a run that computes the same thing with its float sums in another order: the relative
    loss gap at each step of the comparison, and the largest relative weight gap at the end."""

    run: Path
    what: str  # the floor's run, in words
    losses: list[float]
    weights: float

    def reached(self) -> list[float]:
        """How far rounding alone has carried one process by each step: the largest gap so far."""
        return list(itertools.accumulate(self.losses, max))


@dataclass(kw_only=True)
class Comparison:
    """One process's run against the strategy's: the loss of each step in both, the largest relative weight
    difference and where it is, and the rounding floor once it was measured."""

    one_process: Path
    strategy: Path
    steps: list[int]
    one_losses: list[float]
    strategy_losses: list[float]
    loss_tolerance: float
    weight_tolerance: float
    weight_gap: float  # the largest over the weight tensors of |difference| / |one process's tensor| (norms)
    worst_weight: str  # that tensor's key
    floor: Floor | None = None

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
    def needs_floor(self) -> bool:
        """Whether the rounding floor decides: the first step agrees, a later one or the weights do not."""
        return not self.within_tolerances and self.first_step_agrees and self.floor is None

    @property
    def told(self) -> int:
        """How many steps, from the first, the comparison can tell: those before rounding alone carried one
        process further than verify.loss_tolerance."""
        if self.floor is None:
            return len(self.steps)
        return next((i for i, most in enumerate(self.floor.reached()) if most > self.loss_tolerance), len(self.steps))

    @property
    def blind_from(self) -> int | None:
        """The step from which the comparison cannot tell, or None."""
        return self.steps[self.told] if self.told < len(self.steps) else None

    @property
    def weights_told(self) -> bool:
        """The weights at the end are judged only when every step was told and rounding alone moves them by no more
        than verify.weight_tolerance."""
        return self.blind_from is None and (self.floor is None or self.floor.weights <= self.weight_tolerance)

    def _step_agrees(self, i: int) -> bool:
        gap = self.loss_gaps[i]
        if gap <= self.loss_tolerance:
            return True
        return i > 0 and self.floor is not None and gap <= ROUNDING_MARGIN * self.floor.reached()[i]

    @property
    def weights_agree(self) -> bool:
        return self.weight_gap <= self.weight_tolerance or (
            self.floor is not None and self.weight_gap <= ROUNDING_MARGIN * self.floor.weights)

    @property
    def first_differing_step(self) -> int | None:
        """The first step, of those the comparison tells (and the first one, always), whose loss differs more than
        rounding explains."""
        return next((self.steps[i] for i in range(max(self.told, 1)) if not self._step_agrees(i)), None)

    @property
    def verdict(self) -> str:
        if self.first_differing_step is not None or (self.weights_told and not self.weights_agree):
            return NOT_EQUAL
        if self.blind_from is not None or not self.weights_told:
            return CANNOT_TELL
        return EQUAL

    @property
    def equal(self) -> bool:
        return self.verdict == EQUAL

    @property
    def differs(self) -> bool:
        return self.verdict == NOT_EQUAL

    def tells_where(self, other: "Comparison") -> bool:
        """Whether this comparison tells at the point where `other` differs: its first differing step, or the
        weights when only they differ."""
        step = other.first_differing_step
        return self.weights_told if step is None else self.blind_from is None or step < self.blind_from

    def told_text(self) -> str:
        """What of the runs the comparison tells."""
        if self.blind_from is not None:
            return f"steps 1 to {self.told}" if self.told else "no step"
        return "every step's loss and the weights" if self.weights_told else "every step's loss, not the weights"

    def gaps_text(self) -> str:
        said = f"loss {self.loss_gap:.1e}, weights {self.weight_gap:.1e} relative at most"
        if self.floor is not None:
            said += (f"; rounding alone, {self.floor.what}: loss {max(self.floor.losses, default=0.0):.1e}, weights "
                     f"{self.floor.weights:.1e}")
        return said

    def verdict_text(self) -> str:
        """The verdict in words, with its numbers."""
        steps = len(self.steps)
        if self.verdict == EQUAL and self.loss_gap == 0 and self.weight_gap == 0:  # trainer.invariant's promise
            return (f"equal to one process over {steps} steps, bitwise: 0 difference in every step's loss and every "
                    "weight")
        if self.verdict == EQUAL:
            return f"equal to one process over {steps} steps ({self.gaps_text()})"
        if self.verdict == NOT_EQUAL:
            return "not equal to one process"
        if self.blind_from is None:
            return (f"equal to one process in the loss of all {steps} steps (loss {self.loss_gap:.1e} relative at "
                    f"most), but the weights at the end cannot tell: rounding alone moves them by "
                    f"{self.floor.weights:.1e} relative ({self.floor.what}), more than verify.weight_tolerance="
                    f"{self.weight_tolerance:g}; allow a larger verify.weight_tolerance or compare fewer steps")
        told = self.told
        if told:
            said = (f"equal to one process over the first {told} step(s) (loss {max(self.loss_gaps[:told]):.1e} "
                    f"relative at most there); from step {self.blind_from} on")
        else:
            said = f"from step {self.blind_from} on"
        return (f"{said} the comparison can no longer tell equal from not: rounding alone carries one process "
                f"{self.floor.reached()[told]:.1e} from itself there ({self.floor.what}), more than "
                f"verify.loss_tolerance={self.loss_tolerance:g}; compare fewer steps"
                f"{f' (verify.steps={told})' if told else ''} or allow a larger verify.loss_tolerance")

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
        if self.floor is not None:
            said += (f"; more than {ROUNDING_MARGIN} times rounding alone ({self.floor.what}: loss "
                     f"{max(self.floor.losses, default=0.0):.1e}, weights {self.floor.weights:.1e})")
        return said

    def table(self, name: str, most: int = 30) -> list[str]:
        """The losses step by step (the first and last rows of a long run), and the floor's when it was measured."""
        floor = self.floor.losses if self.floor is not None else [None] * len(self.steps)
        rows = list(zip(self.steps, self.one_losses, self.strategy_losses, self.loss_gaps, floor))
        if len(rows) > most:
            rows = rows[:most - 5] + [None] + rows[-5:]
        width = max(len(name), 12)
        lines = [f"  {'step':>5}  {'one process':>12}  {name:>{width}}  {'relative':>9}"
                 + (f"  {'rounding':>9}" if self.floor is not None else "")]
        blind = self.blind_from
        for row in rows:
            if row is None:
                lines.append(f"  {'...':>5}")
                continue
            step, one, other, gap, alone = row
            mark = ("  <- cannot tell" if blind is not None and step >= blind
                    else "  <- differs" if gap > self.loss_tolerance and not self._step_agrees(self.steps.index(step))
                    else "")
            lines.append(f"  {step:>5}  {one:>12.6f}  {other:>{width}.6f}  {gap:>9.1e}"
                         + (f"  {alone:>9.1e}" if alone is not None else "") + mark)
        return lines

    def to_json(self) -> dict:
        floor = None if self.floor is None else {"run": str(self.floor.run), "what": self.floor.what,
                                                  "loss_gap": max(self.floor.losses, default=0.0),
                                                  "weight_gap": self.floor.weights}
        alone = self.floor.losses if self.floor is not None else [None] * len(self.steps)
        return {"one_process": str(self.one_process), "strategy": str(self.strategy), "verdict": self.verdict,
                "equal": self.equal, "loss_gap": self.loss_gap, "weight_gap": self.weight_gap,
                "worst_weight": self.worst_weight, "first_differing_step": self.first_differing_step,
                "cannot_tell_from_step": self.blind_from, "floor": floor,
                "steps": [{"step": s, "one_process": a, "strategy": b, "relative": g, "rounding": f}
                          for s, a, b, g, f in zip(self.steps, self.one_losses, self.strategy_losses,
                                                   self.loss_gaps, alone)]}


def relative(reference: float, other: float) -> float:
    return abs(other - reference) / max(abs(reference), 1e-12)
