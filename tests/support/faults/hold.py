"""Test-only: a run that a test must stop (or change) at a point reaches that point and waits there, so the test acts
on a run that is where it should be, whatever the machine's speed (a test that watched the output for a window
lost the race on a busy or a fast machine). A callback like any other of the callbacks group, with this folder on
PYTHONPATH (tests/conftest.py: held_at):

    PYTHONPATH=tests/support/faults python train.py +callbacks.hold._target_=hold.HoldAt +callbacks.hold.step=6 \
        [+callbacks.hold.rank=0] ["+callbacks.hold.runs='1_*'"]

At the end of step `step`, on rank `rank`, in a run whose folder's name matches `runs` (a sweep's job: '1_*'), it
writes <run folder>/held_at_step_<step> and waits until the test removes that file, or a stop is asked for: a
signal (an in-process run notes it and stops at this step's boundary; a worker process gets KeyboardInterrupt or
is ended by its launcher). It holds once per run folder: a run resumed into the folder goes past the step."""
from __future__ import annotations

import fnmatch
import os
import time

from framework.callbacks.base import Callback

POLL_S = 0.05


class HoldAt(Callback):
    def __init__(self, step: int, rank: int = 0, runs: str = "*"):
        self.step, self.rank, self.runs = step, rank, runs

    def on_train_step_end(self, state, step: int) -> None:
        run_dir = state.run_dir
        if step != self.step or state.rank != self.rank or not fnmatch.fnmatch(run_dir.name, self.runs):
            return
        try:  # once per run folder
            os.close(os.open(run_dir / f".held_at_step_{step}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        marker = run_dir / f"held_at_step_{step}"
        marker.write_text(str(os.getpid()))
        while marker.exists() and not state.stop_signalled:
            time.sleep(POLL_S)
