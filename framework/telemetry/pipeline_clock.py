"""Pipeline parallel: where a stage's time goes within the schedule's steps, per log interval. One clock per rank
(where a schedule puts several stages on a rank, they share it).

    compute  its own forward and backward chunks (the zero-bubble schedules' weight gradients too) and the loss
             (measured: perf_counter on the CPU, CUDA events on the rank's stream on a GPU, read at the log boundary
             after the meter's sync)
    comm     moving its inputs and gradients in: the messages it received x the time such a message takes on the
             link to the rank that sent it (latency + bytes / bandwidth), which the engine measured once at start
             with its neighbours; an estimate from measured link speed, as a message's transfer cannot be told from
             the wait before it without clocks on both ends. Plus what is measured: FSDP2's reduce-scatter of the
             stage's gradients after its last backward, and, in the first step only, the schedule's inference of
             each stage's shapes (a forward and a backward on meta tensors, the shapes sent between the stages)
    bubble   the rest of the schedule's wall time: waiting for a neighbouring stage (fill and drain of the pipeline)

TensorBoard: time/wait_ms/rank{r} is the bubble, time/comm_ms/rank{r} the communication, time/forward_ms and
time/backward_ms the compute, per optimizer step (framework/telemetry/scalars.py)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from framework.telemetry.wait_clock import seconds_between, timestamp


@dataclass(frozen=True)
class Link:
    """A point-to-point link's measured cost: seconds per message and per byte."""

    latency_s: float
    seconds_per_byte: float

    def seconds(self, messages: int, nbytes: int) -> float:
        return messages * self.latency_s + nbytes * self.seconds_per_byte


class PipelineClock:
    ends_with_backward = False  # the schedule's own span says where the pipeline's waits are
    caveat = None
    MEASURED_COMM = ("reduce", "inference")  # spans of communication timed as they happen

    def __init__(self, device: torch.device):
        self.device = device
        self.links: dict[int, Link] = {}  # by the peer's pipeline rank: set once measured
        self.reset()

    def reset(self) -> None:
        self.spans: dict[str, list] = {"forward": [], "backward": [], "schedule": [], "reduce": [], "inference": []}
        self.received: dict[int, list[int]] = {}  # by the sender's pipeline rank: messages, bytes

    @contextlib.contextmanager
    def span(self, kind: str):
        """kind: forward or backward (this stage's compute), reduce (its gradients' reduction), inference (the
        schedule's shape inference), or schedule (one step of the schedule, all of it)."""
        start = timestamp(self.device)
        try:
            yield
        finally:
            self.spans[kind].append((start, timestamp(self.device)))

    def received_from(self, peer: int, tensors: list[torch.Tensor]) -> None:
        """Messages this stage receives from the pipeline rank `peer` (activations from a stage before it, gradients
        from one after)."""
        counts = self.received.setdefault(peer, [0, 0])
        counts[0] += len(tensors)
        counts[1] += sum(t.numel() * t.element_size() for t in tensors)

    def _seconds(self, kind: str) -> float:
        return sum(seconds_between(a, b) for a, b in self.spans[kind])

    def comm_seconds(self) -> float:
        estimated = sum(self.links[peer].seconds(*counts) for peer, counts in self.received.items()
                        if peer in self.links)
        return estimated + sum(self._seconds(kind) for kind in self.MEASURED_COMM)

    def read(self, slots: int = 1) -> float:
        """The bubble: the schedule's wall time that was neither this stage's compute nor its communication."""
        compute = self._seconds("forward") + self._seconds("backward")
        return max(0.0, self._seconds("schedule") - compute - self.comm_seconds())

    def phases(self, slots: int = 1) -> dict[str, list[float]]:
        return {"forward": [self._seconds("forward")], "backward": [self._seconds("backward")]}

    def comm(self, slots: int = 1) -> float:
        return self.comm_seconds()
