"""dp: each replica's forward and backward time on its own GPU, and from them its busy and wait time.

nn.DataParallel runs every replica's forward in a thread of its own on that GPU's current stream, and autograd
runs each GPU's share of backward in that GPU's own thread. TimedReplica, the module every replica runs, marks
there: forward start and end around the module, backward start when the output's gradient reaches that GPU,
backward end when every parameter copy of the replica has its gradient (one multi-grad hook). With nothing
replicated (one GPU, or the CPU) backward end is a callback queued on autograd's engine for the end of the
backward: cheaper than a hook on every parameter each step.

On a GPU a mark is a CUDA event on the replica's stream, read at the log boundary only (after the meter's one
sync); on the CPU a perf_counter reading. On several GPUs every replica's parameter copies come out of one Broadcast
node, whose backward sums the replicas' gradients: each replica hooks that node once (not every copy: those hooks
fire one after another on the backward's critical path), so the hooks run once every replica's backward has been
queued. The event each one records on its replica's stream still completes when that GPU has finished its own
backward kernels, so a GPU-bound replica's backward end is its own; a launch-bound one (a small model) shares the
host moment of the slowest replica's launch, so its wait reads low (CAVEAT, said in the run's output).

Busy and wait mean what they mean for ddp. The replicas meet after every forward (outputs gathered on the first
GPU) and after every backward (gradients summed there), so in each phase a replica that finished before the
slowest one waits the difference: wait_r = sum over micro-batches of (max forward - forward_r) + (max backward -
backward_r). The slowest replica waits 0; one replica alone waits 0.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from framework.telemetry.wait_clock import seconds_between, timestamp

PHASES = ("forward", "backward")


class _Marks:
    """One replica's four marks in one micro-batch."""

    __slots__ = ("forward_start", "forward_end", "backward_start", "backward_end")

    def __init__(self):
        self.forward_start = self.forward_end = self.backward_start = self.backward_end = None


CAVEAT = ("dp on several GPUs: a replica's backward ends when autograd sums the replicas' gradients; on a GPU-bound "
          "replica that is its own end, but small (launch-bound) replicas share the slowest one's, so their "
          "time/wait_ms reads low")


class ReplicaClock:
    def __init__(self, devices: list[torch.device]):
        self.devices = devices  # one per slot (replica), in DataParallel's device_ids order
        self.caveat = CAVEAT if len(devices) > 1 else None
        self.reset()

    def reset(self) -> None:
        self.micro_batches: list[dict[int, _Marks]] = []

    def begin_micro_batch(self) -> None:
        """DataParallel's forward is about to scatter a new micro-batch to the replicas."""
        if torch.is_grad_enabled():  # evaluation runs under no_grad and is not timed
            self.micro_batches.append({})

    def slot_of(self, args) -> int:
        if len(self.devices) == 1:
            return 0
        first = next(t for t in tree_leaves(args) if isinstance(t, torch.Tensor))
        return self.devices.index(first.device)

    def mark(self, slot: int):
        return timestamp(self.devices[slot])

    def phase_seconds(self, slots: int) -> dict[str, list[list[float]]]:
        """{phase: [micro-batch][slot] seconds} of every complete micro-batch since the last reset that ran on the
        first `slots` replicas (nn.DataParallel scatters a micro-batch over device_ids[:chunks], and a micro-batch
        smaller than the GPUs makes fewer chunks); on a GPU call it after the device has been synchronized."""
        out = {phase: [] for phase in PHASES}
        for marks in self.micro_batches:
            if sorted(marks) != list(range(slots)) or any(getattr(m, name) is None for m in marks.values()
                                                         for name in _Marks.__slots__):
                continue  # another number of replicas ran it, or its backward has not run
            for phase in PHASES:
                out[phase].append([seconds_between(getattr(marks[s], f"{phase}_start"), getattr(marks[s], f"{phase}_end"))
                                   for s in range(slots)])
        return out

    def read(self, slots: int) -> list[float]:
        """Seconds each of the first `slots` replicas waited for the slowest one since the last reset."""
        waits = [0.0] * slots
        for per_micro_batch in self.phase_seconds(slots).values():
            for seconds in per_micro_batch:
                slowest = max(seconds)
                waits = [w + slowest - s for w, s in zip(waits, seconds)]
        return waits

    def phases(self, slots: int) -> dict[str, list[float]]:
        """Seconds each of the first `slots` replicas spent in forward and in backward since the last reset."""
        return {phase: [sum(column) for column in zip(*per_micro_batch)] if per_micro_batch else [0.0] * slots
                for phase, per_micro_batch in self.phase_seconds(slots).items()}


def _replica_parameters(module: nn.Module):
    """The parameters this replica computes with. A DataParallel replica's parameters() is empty: replicate() sets
    each copy as a plain attribute and lists it in `_former_parameters` (which DDP reads the same way)."""
    for m in module.modules():
        yield from (m._former_parameters.values() if hasattr(m, "_former_parameters")
                    else m.parameters(recurse=False))


class TimedReplica(nn.Module):
    """What every dp replica runs: the user's module under the run's autocast dtype, timed by the clock.

    The dtype is entered inside the replica: nn.DataParallel runs each replica in a thread of its own and re-enters
    autocast there without a dtype, and a new thread's CUDA autocast dtype is fp16, so bf16 runs would otherwise
    train their replicas in fp16."""

    def __init__(self, module: nn.Module, clock: ReplicaClock, device_type: str, dtype: torch.dtype | None):
        super().__init__()
        self.module, self.clock, self.device_type, self.dtype = module, clock, device_type, dtype

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled() or not self.clock.micro_batches:
            return self._run(args, kwargs)
        slot = self.clock.slot_of(args)
        marks = _Marks()
        marks.forward_start = self.clock.mark(slot)
        out = self._run(args, kwargs)
        marks.forward_end = self.clock.mark(slot)
        self.clock.micro_batches[-1][slot] = marks
        self._time_backward(out, slot, marks)
        return out

    def _run(self, args, kwargs):
        if self.dtype is None:
            return self.module(*args, **kwargs)
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.module(*args, **kwargs)

    def _time_backward(self, out, slot: int, marks: _Marks) -> None:
        first = next((t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad), None)
        if first is None:
            return
        # DataParallel's replicas compute with non-leaf copies of the parameters, made anew each forward by one
        # Broadcast node (whose backward sums the replicas' gradients)
        copy = next((p for p in _replica_parameters(self.module) if p.requires_grad and not p.is_leaf), None)

        def backward_done(*_):
            marks.backward_end = self.clock.mark(slot)

        def backward_started(grad):
            marks.backward_start = self.clock.mark(slot)
            if copy is None:  # nothing replicated (one GPU, the CPU): this replica's backward is the whole backward
                torch.autograd.Variable._execution_engine.queue_callback(backward_done)

        first.register_hook(backward_started)  # the output is new each forward: its hook goes with it
        if copy is not None:
            copy.grad_fn.register_prehook(backward_done)  # one hook on the node, not one per parameter copy
