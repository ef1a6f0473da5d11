"""Users' code that stalls a run, as tests/test_stall.py needs it: a Dataset whose reads block on one rank (a stuck
network file system, a deadlocked decoder), a callback that enters a collective on one rank only."""
import os
import threading

import torch.distributed as dist

from framework.callbacks.base import Callback
from mypkg.data import Blobs


def _rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))


class StallingBlobs(Blobs):
    """Blobs whose reads block forever on `rank` after `after` of them."""

    def __init__(self, train: bool = True, size: int = 512, rank: int = 1, after: int = 300):
        super().__init__(train, size)
        self.stall_rank, self.after, self.reads = rank, after, 0

    def __getitem__(self, i):
        self.reads += 1
        if _rank() == self.stall_rank and self.reads > self.after:
            threading.Event().wait()  # the read that never returns
        return super().__getitem__(i)


class BarrierOnOneRank(Callback):
    """At `step`, `rank` enters a collective the others never call (the others go on into the next step's gradient
    all-reduce). Every rank first writes <run folder>/at_step_<step>_rank<r>: what a test waits for before it acts."""

    def __init__(self, step: int = 5, rank: int = 0):
        self.step, self.rank = step, rank

    def on_train_step_end(self, state, step: int) -> None:
        if step != self.step:
            return
        (state.run_dir / f"at_step_{step}_rank{_rank()}").touch()
        if _rank() == self.rank:
            dist.barrier()
