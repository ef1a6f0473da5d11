"""What the training loop needs from an engine (framework/strategies/: every strategy provides these): the process
group its worker joined, and what parallelize() made of the model. Abilities only some engines have are small
protocols the loop asks for (isinstance), never base methods that do nothing."""
from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ContextManager, Protocol, runtime_checkable

import torch
from torch import nn

from framework.training.checkpoint_io import CheckpointIO
from framework.training.metrics import per_sample_losses
from framework.training.precision import Precision
from framework.training.step import StepOutput


class ProcessGroup(ABC):
    """This worker's place in the job, and the collectives over every rank of it. Every rank must reach every
    collective (a rank that skips one leaves the others waiting). A subclass that leaves a collective out cannot be
    built: each is abstract."""

    def __init__(self, rank: int, local_rank: int, world_size: int, device: torch.device,
                 devices: list[torch.device] | None = None):
        self.rank, self.local_rank, self.world_size, self.device = rank, local_rank, world_size, device
        self.devices = list(devices or [device])  # every device this process trains on (dp: one per replica)
        # This rank's place among the data-parallel ranks, which the data is sharded over: every rank, except where
        # model parallel peers (tensor, pipeline) share one shard of the data (framework/strategies/mesh/)
        self.dp_rank, self.dp_size = rank, world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def cuda_devices(self) -> list[int]:
        """Indices of the GPUs this process trains on (their RNG streams are checkpointed, their memory metered)."""
        return [d.index for d in self.devices if d.type == "cuda"]

    @abstractmethod
    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """t from every rank stacked along a new first dimension, in rank order (same shape on every rank)."""

    @abstractmethod
    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """The sum of t over every rank, on every rank."""

    def dp_all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """The sum of t over the data-parallel ranks (what a stream's ranks agree on its step counts with). Model
        parallel peers hold the same data, so their values are equal: the sum over every rank counts each
        data-parallel rank's value once per peer (exact for the counts it is used for)."""
        t = self.all_reduce_sum(t)
        peers = self.world_size // self.dp_size
        return t if peers == 1 else t // peers if not t.is_floating_point() else t / peers

    @abstractmethod
    def gather_objects(self, obj) -> list:
        """Every rank's obj (picklable; tensors in it on the CPU), in rank order, on every rank."""

    @abstractmethod
    def broadcast_object(self, obj):
        """Rank 0's obj on every rank (the others pass anything, e.g. None)."""

    @abstractmethod
    def barrier(self) -> None:
        """Returns once every rank has called it."""

    @abstractmethod
    def leave(self, wait_for_peers: bool) -> None:
        """Leave the group; with wait_for_peers only once every rank got here (every rank passes the same value)."""


class LocalGroup(ProcessGroup):
    """One process, alone: every collective is the identity."""

    def __init__(self, device: torch.device, devices: list[torch.device] | None = None):
        super().__init__(0, 0, 1, device, devices)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        return t.unsqueeze(0)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def gather_objects(self, obj) -> list:
        return [obj]

    def broadcast_object(self, obj):
        return obj

    def barrier(self) -> None:
        pass

    def leave(self, wait_for_peers: bool) -> None:
        pass


@dataclass
class Wrapped:
    """What parallelize() made of the user's model: what the loop trains with."""

    model: nn.Module  # what the training step calls (the engine's wrapper around the user's module)
    optimizer: torch.optim.Optimizer
    precision: Precision  # autocast, backward and the optimizer step, as this engine needs them
    checkpoint_io: CheckpointIO  # how model and optimizer go into a checkpoint and come back
    module: nn.Module  # the user's module inside the engine's wrapper: what weights files hold
    eval_model: nn.Module | None = None  # what evaluation calls, where not `model` (a wrapper that talks in forward)

    def evaluation_model(self) -> nn.Module:
        return self.model if self.eval_model is None else self.eval_model

    def close(self) -> None:
        """The worker is done with it (an engine with resources of its own frees them)."""


@runtime_checkable
class GradientSync(Protocol):
    """An engine that reduces gradients inside backward (ddp, fsdp): a micro-batch that is not the last of an
    accumulation runs its forward and backward inside gradient_sync(False) and keeps its gradients local."""

    def gradient_sync(self, on: bool) -> ContextManager: ...


@runtime_checkable
class SlotSplit(Protocol):
    """One process that drives several GPUs (dp): how a micro-batch splits over them (one slot per GPU that gets a
    share; per-slot meters are TensorBoard's rank{r})."""

    def slot_sizes(self, micro_batch: int) -> list[int]: ...


@runtime_checkable
class OwnsForwardBackward(Protocol):
    """An engine that runs forward and backward together (pipeline parallel: its schedule interleaves the forwards
    and backwards of micro-batches across stages): one micro-batch of the loop through step(model, batch, loss), its
    per-sample losses weighted as `weighting` says backpropagated. Returns the step's output with the per-sample
    losses (on every rank, also those that never see the loss)."""

    def forward_backward(self, step, batch, loss, weighting: "Weighting") -> StepOutput: ...


@runtime_checkable
class OwnClock(Protocol):
    """An engine that tells its own work from its waits for the others (framework/telemetry/wait_clock.py): ddp's
    comm hook, dp's replicas, Horovod's synchronize, DeepSpeed ZeRO 0-2's backward, the mesh's collectives
    (framework/strategies/mesh/comm_clock.py), pipeline parallel's stages. wait_clock(group) makes the clock, its hooks
    attached (once, before the first forward); None where the waits cannot be told from the work."""

    def wait_clock(self, group: "ProcessGroup"): ...


@runtime_checkable
class CountsTraffic(Protocol):
    """An engine that counts the gradient bytes it hands to its collectives and what they weigh uncompressed
    (framework/telemetry/traffic.py): ddp's communication hook, Horovod's compressor, FSDP2's reduce-scatters
    (framework/strategies/mesh/fsdp_traffic.py); `traffic` None where it counts none."""

    @property
    def traffic(self): ...


@runtime_checkable
class EngineState(Protocol):
    """An engine that keeps training state of its own beside model and optimizer, different on each rank (ddp's
    PowerSGD: each rank's error feedback, the warm-start factors, its step count). Every checkpoint holds every
    rank's (framework/training/checkpointing.py): engine_state is this rank's own (CPU tensors and plain values; no
    collective), which each rank writes itself where it holds tensors; a resume gives each rank its own back (rank
    0's where `saved_world`, the ranks that wrote it, is not this world size; None: the checkpoint holds none), and
    the engine says what it resets ('' for nothing): another world size, another strategy.compression."""

    def engine_state(self) -> dict: ...

    def load_engine_state(self, mine: dict | None, saved_world: int, world_size: int, step: int) -> str: ...


@dataclasses.dataclass(frozen=True)
class Weighting:
    """What a micro-batch's per-sample losses backpropagate: batches of one known size, the mean / k (k micro-batches
    a step); a stream's (scale set: framework/data/streams.py), each real sample's loss x scale, so that the engines'
    mean over ranks is the mean over the samples the step had, and 0 for a repeat of a rank out of data."""

    k: int
    scale: float | None = None
    real: bool = True

    def objective(self, per_sample: torch.Tensor, parts: int = 1) -> torch.Tensor:
        """`parts`: the equal pieces an engine cuts the micro-batch into (a pipeline's micro-batches), each its own
        objective."""
        if self.scale is None:
            return per_sample.mean() / (self.k * parts)
        return per_sample.sum() * (self.scale if self.real else 0.0)


def forward_backward(wrapped: Wrapped, step, batch, loss, weighting: Weighting) -> StepOutput:
    """One micro-batch: forward through the step under the engine's autocast, backward of the weighted per-sample
    losses; the step's output with its per-sample losses."""
    if isinstance(wrapped, OwnsForwardBackward):
        return wrapped.forward_backward(step, batch, loss, weighting)
    with wrapped.precision.autocast():
        out = step(wrapped.model, batch, loss)
    per_sample = per_sample_losses(out.loss, out.samples)
    wrapped.precision.backward(weighting.objective(per_sample))
    return dataclasses.replace(out, loss=per_sample)


def gradient_sync(wrapped: Wrapped, on: bool) -> ContextManager:
    return wrapped.gradient_sync(on) if isinstance(wrapped, GradientSync) else contextlib.nullcontext()


def slot_sizes(wrapped: Wrapped, micro_batch: int) -> list[int]:
    return wrapped.slot_sizes(micro_batch) if isinstance(wrapped, SlotSplit) else [micro_batch]
