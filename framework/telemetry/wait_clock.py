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


def timestamp(device: torch.device):
    """Now, on `device`'s timeline: a CUDA event recorded on its current stream, or a perf_counter reading."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


def seconds_between(start, end) -> float:
    """Seconds from one timestamp() to a later one; for CUDA events, after the device has been synchronized."""
    return start.elapsed_time(end) / 1000 if isinstance(start, torch.cuda.Event) else end - start


class WaitClock:
    caveat = None  # what its numbers cannot show, said once at the start of a run (dp's replica clock has one)

    def __init__(self, device: torch.device, ends_with_backward: bool = False):
        self.device = device
        # the rank is released when the last micro-batch's backward returns (ddp, DeepSpeed): the loop says when
        self.ends_with_backward = ends_with_backward
        self.cuda = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.seconds = 0.0
        self.spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.started = None

    def start(self) -> None:
        """This rank's own work is done from here on; a later start() moves the mark (the last bucket wins)."""
        if self.cuda and self.started is not None:
            self.started.record(torch.cuda.current_stream(self.device))  # the latest record is the one read
        else:
            self.started = timestamp(self.device)

    def stop(self) -> None:
        """The rank is released: the span since the last start() was waiting."""
        if self.started is None:
            return
        end = timestamp(self.device)
        if self.cuda:
            self.spans.append((self.started, end))  # read at the log boundary, after the sync
        else:
            self.seconds += seconds_between(self.started, end)
        self.started = None

    @contextlib.contextmanager
    def blocking(self):
        """The whole block waits for other ranks (a barrier)."""
        self.start()
        try:
            yield
        finally:
            self.stop()

    def phases(self, slots: int = 1) -> None:
        """No forward/backward split: that is dp's replica clock (framework/telemetry/replica_clock.py)."""
        return None

    def read(self, slots: int = 1) -> float:
        """Seconds this process waited since the last reset (its one slot's); on a GPU call it after the device has
        been synchronized."""
        return self.seconds + sum(seconds_between(a, b) for a, b in self.spans)


def start_when_gradients_are_done(model: torch.nn.Module, clock: WaitClock) -> None:
    """For engines that reduce gradients behind the optimizer (Horovod) or inside their own backward (DeepSpeed): once
    every parameter's gradient of a backward is computed, what follows until the engine hands the averaged gradients
    back is waiting. One mark per backward (torch's multi-grad hook: it fires once all of them are in), not one per
    parameter."""
    params = [p for p in model.parameters() if p.requires_grad]
    if params:
        torch.autograd.graph.register_multi_grad_hook(params, lambda grads: clock.start(), mode="all")


def stop_after(owner, method: str, clock: WaitClock) -> None:
    """owner.method() returns when this rank is released (Horovod's synchronize: every gradient's all-reduce done)."""
    original = getattr(owner, method)

    def released(*args, **kwargs):
        result = original(*args, **kwargs)
        clock.stop()
        return result

    setattr(owner, method, released)
