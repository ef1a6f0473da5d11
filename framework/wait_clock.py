"""Time a rank spends blocked on the other ranks, measured on that rank without a device sync per step.

A wait starts when this rank's own work is done (DDP: the last gradient bucket became ready, i.e. local backward
finished; a barrier: the call) and ends when the collective lets it go (backward() returned; the barrier returned).
On the CPU both ends are perf_counter readings. On a GPU both ends are CUDA events recorded on the current stream,
so the span is the GPU's own timeline; the events are only read at the log boundary, after the meter's one sync.
The span includes the last all-reduce's own transfer time: on the slowest rank that is all that remains."""
from __future__ import annotations

import contextlib
import time

import torch


class WaitClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.seconds = 0.0
        self.spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.started = None

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        """This rank's own work is done from here on; a later start() moves the mark (the last bucket wins)."""
        self.started = self._now()

    def stop(self) -> None:
        """The rank is released: the span since the last start() was waiting."""
        if self.started is None:
            return
        end = self._now()
        if self.cuda:
            self.spans.append((self.started, end))
        else:
            self.seconds += end - self.started
        self.started = None

    @contextlib.contextmanager
    def blocking(self):
        """The whole block waits for other ranks (a barrier)."""
        self.start()
        try:
            yield
        finally:
            self.stop()

    def read(self) -> float:
        """Seconds waited since the last reset; on a GPU call it after the device has been synchronized."""
        return self.seconds + sum(a.elapsed_time(b) for a, b in self.spans) / 1000
