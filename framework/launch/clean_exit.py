"""Leaving a worker process whose run has finished, without the interpreter's native teardown.

Once the results are handed over and the process group is shut down, only interpreter teardown is left,
and there a C++ thread destructor of torch's distributed stack now and then aborts the process
("terminate called without an active exception", SIGABRT). Seen with ddp under torchrun and with
DeepSpeed; it turned finished runs into failed ones. A finished worker therefore exits at once."""
from __future__ import annotations

import atexit
import multiprocessing
import os
import sys


def exit_now(code: int = 0) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_at_end_of_finished_worker() -> None:
    """For a worker the elastic agent spawned: its result travels back when the entry function returns,
    so the exit happens at interpreter shutdown (registered last, so it runs first)."""
    if multiprocessing.parent_process() is not None:
        atexit.register(exit_now, 0)
