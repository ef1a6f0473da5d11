"""Fault injection for the fault-tolerance and per-GPU-metrics tests (and for trying them by hand): a callback that the
worker adds when HYDRA_DIST_FAULT is set, and that is nowhere else in the loop.

HYDRA_DIST_FAULT=<point>:<value>:<rank>[,<point>:<value>:<rank>...] with point one of
  kill_after_step  SIGKILL this worker right after optimizer step <value>
  kill_in_eval     SIGKILL this worker as the evaluation that follows step <value> starts
  nan_loss         the model's output (so the loss) is NaN in every micro-batch of step <value> on this rank
  slow_rank        sleep <value> seconds (a number) in every training forward of slot <rank>: a straggling GPU
                   (a ddp rank; under dp the replica, which sleeps on its own GPU's thread, inside its timed span)
Faults fire only in the first attempt (TORCHELASTIC_RESTART_COUNT unset or 0), so a restarted worker group runs
clean. Death is a real SIGKILL, exactly what the OOM killer or a failed node does. (A death halfway through writing
a checkpoint is the tests' own: tests/faults/sitecustomize.py.)
"""
from __future__ import annotations

import os
import signal
import time

import torch

from framework.callbacks.base import Callback
from framework.process.environment import restart_attempt

ENV = "HYDRA_DIST_FAULT"
STEP_POINTS = ("kill_after_step", "kill_in_eval", "nan_loss")
SECONDS_POINTS = ("slow_rank",)
POINTS = STEP_POINTS + SECONDS_POINTS


def _parse(item: str) -> tuple[str, float, int]:
    """One `point:value:rank` item: (point, step or seconds, rank)."""
    parts = item.split(":")
    if len(parts) != 3:
        raise ValueError(f"{ENV} item {item!r} is not <point>:<value>:<rank>")
    point, value, rank = parts
    if point not in POINTS:
        raise ValueError(f"{ENV} point {point!r} is not one of {', '.join(POINTS)}")
    try:
        number = float(value) if point in SECONDS_POINTS else int(value)
        rank_number = int(rank)
    except ValueError:
        kind = "a number of seconds" if point in SECONDS_POINTS else "a step"
        raise ValueError(f"{ENV} item {item!r}: expected {kind} and a rank") from None
    if number < 0:
        raise ValueError(f"{ENV} item {item!r}: the value must be >= 0")
    return point, number, rank_number


def planned_faults() -> list[tuple[str, float, int]]:
    """(point, step or seconds, rank) of every fault planned; empty after a restart."""
    spec = os.environ.get(ENV, "")
    if not spec or restart_attempt() > 0:
        return []
    return [_parse(item) for item in spec.split(",")]


class FaultInjection(Callback):
    def __init__(self, faults: list[tuple[str, float, int]]):
        self.faults = faults
        self.nan_hook = None

    def _at(self, trainer, point: str, step: int) -> bool:
        return any(p == point and v == step and r == trainer.strategy.rank for p, v, r in self.faults)

    def _kill(self, point: str, step: int) -> None:
        print(f"fault injection: SIGKILL at {point} step {step} (pid {os.getpid()})", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def on_fit_start(self, trainer) -> None:
        for point, seconds, slot in self.faults:
            if point == "slow_rank" and seconds:
                self._slow(trainer, seconds, slot)

    def _slow(self, trainer, seconds: float, slot: int) -> None:
        """A forward pre-hook on the user's module: nn.DataParallel's replicas share the module's hooks, so the
        replica on the slot's GPU sleeps in its own thread, inside its timed forward."""
        strategy = trainer.strategy
        devices = strategy.cuda_devices()
        first = strategy.rank * strategy.local_slots()

        def sleep_if_this_slot(module, args):
            if not (module.training and torch.is_grad_enabled()):
                return
            tensor = next((a for a in args if torch.is_tensor(a)), None)
            replica = devices.index(tensor.device.index) if devices and tensor is not None else 0
            if first + replica == slot:
                time.sleep(seconds)

        strategy.unwrap(trainer.wrapped.model).register_forward_pre_hook(sleep_if_this_slot)

    def on_train_step_start(self, trainer, step: int) -> None:
        if self._at(trainer, "nan_loss", step):
            self.nan_hook = trainer.strategy.unwrap(trainer.wrapped.model).register_forward_hook(
                lambda module, args, out: out * float("nan"))

    def on_train_step_end(self, trainer, step: int) -> None:
        if self.nan_hook is not None:
            self.nan_hook.remove()
            self.nan_hook = None
        if self._at(trainer, "kill_after_step", step):
            self._kill("kill_after_step", step)

    def on_evaluation_start(self, trainer, step: int) -> None:
        if self._at(trainer, "kill_in_eval", step):
            self._kill("kill_in_eval", step)
