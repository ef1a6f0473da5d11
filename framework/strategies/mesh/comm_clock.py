"""The mesh's own wait clock (tp, fsdp, hsdp; pipeline stages keep theirs, framework/telemetry/pipeline_clock.py): every
collective a micro-batch's forward and backward make, timed from its launch until it is done, as ddp's clock times
its last all-reduce (framework/telemetry/wait_clock.py). It reports as time/wait_ms/rank{r}, so busy is the rank's
own work and scaling.md splits the step.

A dispatch mode (torch.utils._python_dispatch.TorchDispatchMode), active around each micro-batch (MeshWrapped's
gradient_sync), sees the collectives as the dispatcher runs them: tensor parallel's (DTensor's redistributions,
torch.ops._c10d_functional.*) and FSDP2's gathers and reduce-scatters (torch.ops.c10d.*). Each is waited for where
it is launched (wait_tensor; its Work's wait()), so its span runs from launch to done; the wait torch makes later
finds it done. On the CPU (gloo) that is the time the rank would have blocked a moment later anyway.

What it misses, or counts in full:
- collectives outside a micro-batch's forward and backward: the gradient norm's all-reduce when clipping, partial
  gradients reduced at the optimizer step (framework/strategies/mesh/precision.py), evaluation;
- a redistribution DTensor makes inside another DTensor operation (a mode does not see what runs inside a
  tensor subclass's own dispatch): the plan's redistributions run outside one, in the parallel styles' hooks and
  their backward;
- on a GPU each span is CUDA events on the stream that launched the collective (FSDP2: its all-gather and
  reduce-scatter streams), so a collective that overlapped compute is counted in full: wait is then an upper bound.
Cost: one Python call for every operator of a micro-batch (the mode's dispatch), about 20 us on the CPU. Hence
strategy.comm_clock (timed_by_default): on for CPU workers, off on GPUs unless asked for."""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from framework.telemetry.wait_clock import WaitClock

FUNCTIONAL = "_c10d_functional"  # DTensor's collectives (they return before the data arrives; wait_tensor waits)
EAGER = "c10d"  # torch.distributed's (FSDP2): they return the data and a Work to wait on
NOT_COLLECTIVES = {"_wrap_tensor_autograd"}


def timed_by_default(setting: bool | None, device: torch.device) -> bool:
    """strategy.comm_clock: null times CPU workers' collectives (gloo's block anyway) and not GPUs' (waiting for each
    where it starts would serialize the overlap that FSDP2's prefetch and async tensor parallel rely on)."""
    return setting if setting is not None else device.type != "cuda"


class CommClock(WaitClock):
    """A WaitClock whose spans are the mesh's collectives; timing() puts a micro-batch under it."""

    def __init__(self, device: torch.device):
        super().__init__(device)
        self._mode = _CollectiveTimer(self)

    @contextlib.contextmanager
    def timing(self):
        with self._mode:
            yield


class _CollectiveTimer(TorchDispatchMode):
    def __init__(self, clock: CommClock):
        super().__init__()
        self.clock = clock

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # compiled blocks (trainer.compile) still compile under the mode; it times what they launch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        namespace, name = func.namespace, func._opname
        if namespace not in (FUNCTIONAL, EAGER) or name in NOT_COLLECTIVES:
            return func(*args, **kwargs)
        self.clock.start()
        out = func(*args, **kwargs)
        _wait_for(out, functional=namespace == FUNCTIONAL)
        self.clock.stop()
        return out


def _wait_for(out, functional: bool) -> None:
    """Block until the collective that made `out` is done (a second wait on it returns at once)."""
    if functional:
        for tensor in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(tensor, torch.Tensor):
                torch.ops._c10d_functional.wait_tensor(tensor)
        return
    work = out[-1] if isinstance(out, (list, tuple)) and out else out
    if callable(getattr(work, "wait", None)):
        work.wait()
