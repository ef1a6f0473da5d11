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
        if self.cuda and self.started is not None:
            self.started.record()  # re-recorded: the latest record is the one elapsed_time reads
        else:
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

    def phases(self) -> None:
        """No forward/backward split: that is dp's replica clock (framework/replica_clock.py)."""
        return None

    def read(self) -> float:
        """Seconds waited since the last reset; on a GPU call it after the device has been synchronized."""
        return self.seconds + sum(a.elapsed_time(b) for a, b in self.spans) / 1000


def start_when_gradients_are_done(model: torch.nn.Module, clock: WaitClock) -> None:
    """For engines that reduce gradients behind the optimizer (Horovod) or inside their own backward (DeepSpeed):
    every parameter's gradient, once accumulated, moves the clock's start, so after the last one this rank's
    backward is done and what follows until the engine hands the averaged gradients back is waiting."""
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda _: clock.start())
