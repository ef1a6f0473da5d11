"""Fault injection for the fault-tolerance tests, off unless HYDRA_DIST_FAULT is set.

HYDRA_DIST_FAULT=<point>:<step>:<rank>[,<point>:<step>:<rank>...] with point one of
  kill_after_step  SIGKILL this worker right after optimizer step <step>
  kill_in_checkpoint  SIGKILL the writer halfway through writing the checkpoint of step <step>
  kill_in_eval     SIGKILL this worker in the middle of the evaluation that follows step <step>
  nan_loss         make the loss of step <step> NaN on this rank
Faults fire only in the first attempt (TORCHELASTIC_RESTART_COUNT unset or 0), so a restarted
worker group runs clean. Death is a real SIGKILL, exactly what the OOM killer or a failed node does.
"""
from __future__ import annotations

import os
import signal

from framework.launch.environment import restart_attempt

POINTS = ("kill_after_step", "kill_in_checkpoint", "kill_in_eval", "nan_loss")


class Faults:
    def __init__(self, rank: int):
        self.planned: dict[str, int] = {}
        spec = os.environ.get("HYDRA_DIST_FAULT", "")
        if not spec or restart_attempt() > 0:
            return
        for item in spec.split(","):
            point, step, fault_rank = item.split(":")
            if point not in POINTS:
                raise ValueError(f"HYDRA_DIST_FAULT point {point!r} is not one of {', '.join(POINTS)}")
            if int(fault_rank) == rank:
                self.planned[point] = int(step)

    def due(self, point: str, step: int) -> bool:
        return self.planned.get(point) == step

    def kill_if_due(self, point: str, step: int) -> None:
        if self.due(point, step):
            print(f"fault injection: SIGKILL at {point} step {step} (pid {os.getpid()})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
