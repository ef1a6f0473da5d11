"""One data model for the training loop: a training split is a StepSource, whichever kind it is. The loop asks it for
an epoch's steps (each a StepShare: this rank's micro-batches of one optimizer step), for where the epoch stands
(state(), what a checkpoint records) and tells it where a checkpoint stopped (restore()); it never asks which kind
it holds. A split read by index (framework/data/loaders.py) knows its steps per epoch; a stream
(framework/data/streams.py) does not: its epoch ends when no rank has more.

Every loader takes its rank's place in the data as one DataShare."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import torch

from framework.checkpoints.position import Position


def _alone_sum(t: torch.Tensor) -> torch.Tensor:
    return t


def _alone_gather(obj) -> list:
    return [obj]


@dataclass(frozen=True)
class Peers:
    """The collectives a rank's data goes through: `agree(t)` sums a tensor over the data-parallel ranks (a stream's
    ranks agree on each step's samples with it), `gather(obj)` gives every rank's object in rank order (a stream's
    records, for a checkpoint). Alone, neither has anyone to ask."""

    agree: Callable[[torch.Tensor], torch.Tensor] = _alone_sum
    gather: Callable[[Any], list] = _alone_gather


@dataclass(frozen=True)
class DataShare:
    """This rank's place in the data: its data-parallel rank among `world`, the device its batches go to, the samples
    it takes at a time (a training micro-batch, or an evaluation batch), the micro-batches of one optimizer step,
    the DataLoader workers reading for it (trainer.num_workers) and its peers' collectives."""

    rank: int
    world: int
    device: torch.device
    micro_batch: int
    grad_accum: int = 1
    num_workers: int = 0
    peers: Peers = field(default_factory=Peers)

    @property
    def step_samples(self) -> int:
        """A full step's samples over every data-parallel rank: the global batch."""
        return self.micro_batch * self.world * self.grad_accum


@dataclass
class StepShare:
    """One optimizer step's micro-batches on this rank: the first `real` are data, the rest repeats with weight 0;
    `samples` is the step's total over every rank, `scale` what a real sample's loss is multiplied by (None: batches
    of one known size, each micro-batch's mean / grad_accum), `last` whether the epoch ends with this step."""

    batches: Iterator
    real: int
    samples: int
    scale: float | None = None
    last: bool = False


@dataclass
class Filler:
    """An evaluation batch a rank out of data runs (so every rank runs as many forwards); it is not scored."""

    batch: Any


@dataclass(frozen=True)
class EpochState:
    """Where an epoch stands: the samples of it trained over every rank, and every rank's record of where its readers
    stand (a stream's; None where the samples say it all)."""

    samples: int
    records: list | None = None


class StepSource(Protocol):
    """A training split as the loop takes it."""

    # None: unknown, the epoch ends when no rank has more (the loop's trainer.max_steps, if set, bounds the run)
    steps_per_epoch: int | None

    def shares(self, epoch: int, start: int) -> Iterator[StepShare]:
        """Epoch `epoch`'s steps after its first `start` (the steps this run's batch had done in it), until the
        epoch's last (its StepShare says `last`); asked once more after that, it ends."""

    def state(self) -> EpochState:
        """Where the epoch in progress stands (every rank calls it: a stream's records are gathered)."""

    def restore(self, position: Position) -> None:
        """The next epoch begun is the one a checkpoint stopped in, and continues where `position` says."""
