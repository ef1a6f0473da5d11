"""A user's model whose forward is slow but busy, as tests/runs/test_stall.py needs it: on `rank`, every forward
(training and evaluation) first spins on the CPU for `busy_seconds`, then runs an ordinary MLP. The spinning thread is
runnable all along (on a loaded machine it waits for a core, still runnable), so the stall watchdog must call that
rank slow, not stalled."""
import os
import time

from torch import nn


class BusyMLP(nn.Module):
    def __init__(self, in_shape, num_classes, busy_seconds: float = 3.0, rank: int = 1, hidden: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_shape[0], hidden), nn.ReLU(),
                                 nn.Linear(hidden, num_classes))
        self.busy_seconds, self.rank = busy_seconds, rank

    def forward(self, x):
        if x.device.type != "meta" and int(os.environ.get("RANK", "0")) == self.rank:  # meta: FLOPs being counted
            end = time.monotonic() + self.busy_seconds
            while time.monotonic() < end:
                pass
        return self.net(x)
