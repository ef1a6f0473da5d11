"""dp: each replica's forward and backward time on its own GPU, and from them its busy and wait time.

nn.DataParallel runs every replica's forward in a thread of its own on that GPU's current stream, and autograd
runs each GPU's share of backward in that GPU's own thread. time_replicas() hooks the module every replica runs and
marks there: forward start and end around the module, backward start when the output's gradient reaches that GPU,
backward end when every parameter copy of the replica has its gradient. With nothing replicated (one GPU, or the
CPU) backward end is torch's multi-grad hook over the module's parameters (once all of them have their gradient).

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

from framework.data.batches import leaves
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
    ends_with_backward = False  # each replica's marks say where its backward ended

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
        first = leaves(args)[0]
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
    each copy as a plain attribute and lists it in `_former_parameters` (private; DDP reads it the same way, and torch
    offers no public view of a replica's parameter copies)."""
    for m in module.modules():
        yield from (m._former_parameters.values() if hasattr(m, "_former_parameters")
                    else m.parameters(recurse=False))


def time_replicas(module: nn.Module, clock: ReplicaClock, replicated: bool) -> None:
    """Hooks on the module every replica runs (nn.DataParallel's replicas carry its hooks; on the CPU the one replica
    is the module): forward start and end around it, backward start when the output's gradient reaches the replica,
    backward end when every parameter copy of the replica has its gradient."""
    def forward_started(replica, args):
        if torch.is_grad_enabled() and clock.micro_batches:
            slot = clock.slot_of(args)
            marks = _Marks()
            marks.forward_start = clock.mark(slot)
            clock.micro_batches[-1][slot] = marks

    def forward_done(replica, args, out):
        if not (torch.is_grad_enabled() and clock.micro_batches):
            return
        slot = clock.slot_of(args)
        marks = clock.micro_batches[-1].get(slot)
        if marks is not None:
            marks.forward_end = clock.mark(slot)
            _time_backward(replica, out, slot, marks, clock)

    module.register_forward_pre_hook(forward_started)
    module.register_forward_hook(forward_done)
    params = [p for p in module.parameters() if p.requires_grad]
    if not replicated and params:  # one GPU, or the CPU: this replica's backward is the whole backward
        torch.autograd.graph.register_multi_grad_hook(params, lambda grads: _backward_done(clock, 0), mode="all")


def _backward_done(clock: ReplicaClock, slot: int) -> None:
    marks = clock.micro_batches[-1].get(slot) if clock.micro_batches else None
    if marks is not None and marks.backward_start is not None and marks.backward_end is None:
        marks.backward_end = clock.mark(slot)


def _time_backward(replica: nn.Module, out, slot: int, marks: _Marks, clock: ReplicaClock) -> None:
    first = next((t for t in leaves(out) if t.requires_grad), None)
    if first is None:
        return
    # DataParallel's replicas compute with non-leaf copies of the parameters, made anew each forward by one
    # Broadcast node (whose backward sums the replicas' gradients)
    copy = next((p for p in _replica_parameters(replica) if p.requires_grad and not p.is_leaf), None)

    def backward_started(grad):
        marks.backward_start = clock.mark(slot)

    first.register_hook(backward_started)  # the output is new each forward: its hook goes with it
    if copy is not None:  # one hook on the Broadcast node, not one per parameter copy
        copy.grad_fn.register_prehook(lambda *_: setattr(marks, "backward_end", clock.mark(slot)))
