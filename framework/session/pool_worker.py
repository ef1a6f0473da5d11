"""A job of hydra/launcher=joblib runs in a worker process of loky's pool, which the sweep's driver started and stops.

Ctrl-C is the driver's: a terminal sends SIGINT to its whole foreground process group, and a pool worker that got it
too would die on its own (while idle: loky then calls the pool broken) or start a graceful stop that the driver's
abort cuts short (joblib SIGKILLs every worker with its processes the moment the driver's wait is interrupted), so
each worker, and every process its jobs start, lives in a session of its own. When the driver dies without stopping
the pool (SIGKILL, a crash), nothing would stop the workers: an idle one waits for work forever and a busy one
trains to the end, so each worker watches its parent and ends its whole session when the driver is gone."""
from __future__ import annotations

import os
import signal

from framework.session.lifeline import end_with

_followed: list[int] = []  # the driver's pid, once this worker process watches it


def end_with_the_driver() -> None:
    """In a pool worker, before its first job (then again a no-op): a session of its own, ended with the driver."""
    if _followed:
        return
    driver = os.getppid()
    _followed.append(driver)
    os.setsid()
    end_with(driver, _end_session)


def _end_session() -> None:
    os.killpg(0, signal.SIGKILL)  # this worker's session: the job's ddp workers and data loaders with it
