"""A process that must not outlive another: when the process it depends on ends, however it ends (SIGKILL, a crash),
this one ends too. Used by a joblib pool worker (its driver, the sweep) and by every worker the elastic agent starts
(its driver, the `train.py` process).

Why the workers need it: torch's elastic agent runs inside the driver and is what would stop them, so a SIGKILLed
driver stops nothing. The workers are forked from the worker template (multiprocessing's forkserver, a child of the
driver), so PR_SET_PDEATHSIG (which fires on the death of the parent) would fire only when the template dies, and
the template lives as long as any worker holds its "alive" pipe, i.e. as long as they do. So each worker watches
the driver itself. The template and multiprocessing's resource tracker then end by themselves: each waits for the
last holder of its pipe to close it."""
from __future__ import annotations

import os
import select
import threading
import time
from typing import Callable

POLL_S = 0.2  # where the kernel has no pidfd (Linux < 5.3)


def end_with(pid: int, end: Callable[[], None]) -> None:
    """Call end() in a daemon thread as soon as process `pid` has ended (at once if it is gone already)."""
    threading.Thread(target=_wait_then_end, args=(pid, end), name=f"end-with-{pid}", daemon=True).start()


def _wait_then_end(pid: int, end: Callable[[], None]) -> None:
    try:
        # A pidfd turns readable when the process ends, a zombie its parent has not reaped yet included (the
        # signal 0 of a poll would still find that one alive), and is never another process that reused the pid.
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        end()
        return
    except (AttributeError, OSError):  # no pidfd here: ask every POLL_S
        while _alive(pid):
            time.sleep(POLL_S)
        end()
        return
    select.select([handle], [], [])
    end()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    return True
