"""Fault injection for the fault-tolerance and per-GPU-metrics tests, off unless HYDRA_DIST_FAULT is set.

HYDRA_DIST_FAULT=<point>:<value>:<rank>[,<point>:<value>:<rank>...] with point one of
  kill_after_step  SIGKILL this worker right after optimizer step <value>
  kill_in_checkpoint  SIGKILL the writer halfway through writing the checkpoint of step <value>
  kill_in_eval     SIGKILL this worker in the middle of the evaluation that follows step <value>
  nan_loss         make the loss of step <value> NaN on this rank
  slow_rank        sleep <value> seconds (a number) in every training step of this rank: a straggling GPU
                   (dp: rank is the replica, which sleeps inside its own forward, on its GPU's thread)
Faults fire only in the first attempt (TORCHELASTIC_RESTART_COUNT unset or 0), so a restarted
worker group runs clean. Death is a real SIGKILL, exactly what the OOM killer or a failed node does.
"""
from __future__ import annotations

import os
import signal
import time

from framework.launch.environment import restart_attempt

STEP_POINTS = ("kill_after_step", "kill_in_checkpoint", "kill_in_eval", "nan_loss")
SECONDS_POINTS = ("slow_rank",)
POINTS = STEP_POINTS + SECONDS_POINTS


def _parse(item: str) -> tuple[str, float, int]:
    """One `point:value:rank` item: (point, step or seconds, rank)."""
    parts = item.split(":")
    if len(parts) != 3:
        raise ValueError(f"HYDRA_DIST_FAULT item {item!r} is not <point>:<value>:<rank>")
    point, value, rank = parts
    if point not in POINTS:
        raise ValueError(f"HYDRA_DIST_FAULT point {point!r} is not one of {', '.join(POINTS)}")
    try:
        number = float(value) if point in SECONDS_POINTS else int(value)
        rank_number = int(rank)
    except ValueError:
        kind = "a number of seconds" if point in SECONDS_POINTS else "a step"
        raise ValueError(f"HYDRA_DIST_FAULT item {item!r}: expected {kind} and a rank") from None
    if number < 0:
        raise ValueError(f"HYDRA_DIST_FAULT item {item!r}: the value must be >= 0")
    return point, number, rank_number


def planned_faults(rank: int) -> dict[str, float]:
    """{point: step or seconds} planned for this rank; empty after a restart."""
    spec = os.environ.get("HYDRA_DIST_FAULT", "")
    if not spec or restart_attempt() > 0:
        return {}
    return {point: value for point, value, fault_rank in map(_parse, spec.split(",")) if fault_rank == rank}


class Faults:
    def __init__(self, rank: int, slow_steps: bool = True):
        """slow_steps=False: slow_rank is not this process's to apply (dp slows its replicas itself)."""
        self.planned = planned_faults(rank)
        self.slow_seconds = self.planned.get("slow_rank", 0.0) if slow_steps else 0.0

    def due(self, point: str, step: int) -> bool:
        return point in STEP_POINTS and self.planned.get(point) == step

    def kill_if_due(self, point: str, step: int) -> None:
        if self.due(point, step):
            print(f"fault injection: SIGKILL at {point} step {step} (pid {os.getpid()})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def slow_down(self) -> None:
        """slow_rank: this rank's own work takes longer every step, as on a slower or throttled GPU."""
        if self.slow_seconds:
            time.sleep(self.slow_seconds)
