"""Test-only: fault injection for the fault-tolerance and per-GPU-metrics tests (and for trying them by hand), a
callback a run names like any other, with this folder on PYTHONPATH:

    PYTHONPATH=tests/support/faults python train.py strategy=ddp \
        +callbacks.faults._target_=fault_injection.FaultInjection "+callbacks.faults.plan='slow_rank:0.2:1'"

plan = <point>:<value>:<rank>[,<point>:<value>:<rank>...] with point one of
  kill_after_step  SIGKILL this worker right after optimizer step <value>
  kill_in_eval     SIGKILL this worker as the evaluation that follows step <value> starts
  nan_loss         the model's output (so the loss) is NaN in every micro-batch of step <value> on this rank
  raise_after_step raise a RuntimeError in this worker right after optimizer step <value>
  slow_rank        sleep <value> seconds (a number) in every training forward of slot <rank>: a straggling GPU
                   (a ddp rank; under dp the replica, which sleeps on its own GPU's thread, inside its timed span)
Faults fire only in the first attempt (TORCHELASTIC_RESTART_COUNT unset or 0), so a restarted worker group runs
clean. Death is a real SIGKILL, exactly what the OOM killer or a failed node does. (A death halfway through writing
a checkpoint: sitecustomize.py beside this file.)
"""
from __future__ import annotations

import os
import signal
import time

import torch

from framework.callbacks.base import Callback
from framework.session.environment import restart_attempt

KEY = "callbacks.faults.plan"
STEP_POINTS = ("kill_after_step", "kill_in_eval", "nan_loss", "raise_after_step")
SECONDS_POINTS = ("slow_rank",)
POINTS = STEP_POINTS + SECONDS_POINTS


def _parse(item: str) -> tuple[str, float, int]:
    """One `point:value:rank` item: (point, step or seconds, rank)."""
    parts = item.split(":")
    if len(parts) != 3:
        raise ValueError(f"{KEY} item {item!r} is not <point>:<value>:<rank>")
    point, value, rank = parts
    if point not in POINTS:
        raise ValueError(f"{KEY} point {point!r} is not one of {', '.join(POINTS)}")
    try:
        number = float(value) if point in SECONDS_POINTS else int(value)
        rank_number = int(rank)
    except ValueError:
        kind = "a number of seconds" if point in SECONDS_POINTS else "a step"
        raise ValueError(f"{KEY} item {item!r}: expected {kind} and a rank") from None
    if number < 0:
        raise ValueError(f"{KEY} item {item!r}: the value must be >= 0")
    return point, number, rank_number


def planned_faults(plan: str) -> list[tuple[str, float, int]]:
    """(point, step or seconds, rank) of every fault planned; empty after a restart."""
    if not plan or restart_attempt() > 0:
        return []
    return [_parse(item) for item in plan.split(",")]


class FaultInjection(Callback):
    def __init__(self, plan: str):
        self.faults = planned_faults(plan)
        self.nan_hook = None

    def _at(self, state, point: str, step: int) -> bool:
        return any(p == point and v == step and r == state.rank for p, v, r in self.faults)

    def _kill(self, point: str, step: int) -> None:
        print(f"fault injection: SIGKILL at {point} step {step} (pid {os.getpid()})", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def on_fit_start(self, state) -> None:
        for point, seconds, slot in self.faults:
            if point == "slow_rank" and seconds:
                self._slow(state, seconds, slot)

    def _slow(self, state, seconds: float, slot: int) -> None:
        """A forward pre-hook on the user's module: nn.DataParallel's replicas share the module's hooks, so the
        replica on the slot's GPU sleeps in its own thread, inside its timed forward."""
        devices = [d.index for d in state.devices if d.type == "cuda"]
        first = state.rank * len(state.devices)

        def sleep_if_this_slot(module, args):
            if not (module.training and torch.is_grad_enabled()):
                return
            tensor = next((a for a in args if torch.is_tensor(a)), None)
            replica = devices.index(tensor.device.index) if devices and tensor is not None else 0
            if first + replica == slot:
                time.sleep(seconds)

        state.model.register_forward_pre_hook(sleep_if_this_slot)

    def on_train_step_start(self, state, step: int) -> None:
        if self._at(state, "nan_loss", step):
            self.nan_hook = state.model.register_forward_hook(
                lambda module, args, out: out * float("nan"))

    def on_train_step_end(self, state, step: int) -> None:
        if self.nan_hook is not None:
            self.nan_hook.remove()
            self.nan_hook = None
        if self._at(state, "kill_after_step", step):
            self._kill("kill_after_step", step)
        if self._at(state, "raise_after_step", step):
            raise RuntimeError(f"fault injection: an error after step {step} on rank {state.rank}")

    def on_evaluation_start(self, state, step: int) -> None:
        if self._at(state, "kill_in_eval", step):
            self._kill("kill_in_eval", step)
