"""Test-only streams (torch IterableDatasets) and a probe of what a run trained from them: each sample's input starts
with its id, and ProbeCollate (the split's collate_fn) appends the ids of every micro-batch it makes to a file per
rank under $STREAM_PROBE_DIR, one line per batch, tagged with the epoch the stream was set to. In a full epoch every
batch made is trained (the framework reads ahead by one micro-batch, which at an epoch's end is nothing)."""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import IterableDataset, default_collate

from framework.callbacks.base import Callback

FEATURES, CLASSES = 6, 3


def _samples(size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(CLASSES, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (size,), generator=g)
    x = prototypes[y] + torch.randn(size, FEATURES, generator=g)
    return torch.cat([torch.arange(size, dtype=torch.float32).unsqueeze(1), x], 1), y


class CountingStream(IterableDataset):
    """`size` samples (id, 6 features) -> class, in an order reshuffled per epoch (set_epoch) when shuffle is on."""

    in_shape, num_classes = (FEATURES + 1,), CLASSES

    def __init__(self, size: int, seed: int = 0, shuffle: bool = True, probe: bool = False):
        self.x, self.y = _samples(size, seed)
        self.size, self.seed, self.shuffle, self.epoch, self.probe = size, seed, shuffle, 0, probe

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        return torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()

    def __iter__(self):
        if self.probe:
            record("start", [self.epoch])
        for i in self.order():
            yield self.x[i], self.y[i]


class StatefulStream(CountingStream):
    """The same stream, with torchdata's Stateful protocol: its state is how far into this epoch's order it is."""

    def __init__(self, size: int, seed: int = 0, shuffle: bool = True, probe: bool = False):
        super().__init__(size, seed, shuffle, probe)
        self.next, self.loaded = 0, None

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "next": self.next}

    def load_state_dict(self, state: dict) -> None:
        self.loaded = dict(state)

    def __iter__(self):
        if self.probe:
            record("start", [self.epoch])
        start = 0
        if self.loaded is not None and self.loaded["epoch"] == self.epoch:
            start = self.loaded["next"]
            record("loaded", [start])
        self.loaded = None
        order = self.order()
        for position in range(start, self.size):
            self.next = position + 1
            i = order[position]
            yield self.x[i], self.y[i]


def _rank() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class UnevenStream(IterableDataset):
    """A stream that shards itself: rank r of W yields ids [r * big, r * big + share) where rank 0's share is `big`
    and the others' `small` (so ranks run out at different steps), split over DataLoader workers by id."""

    shards_itself = True
    in_shape, num_classes = (FEATURES + 1,), CLASSES

    def __init__(self, big: int, small: int, seed: int = 0, probe: bool = False):
        self.big, self.small, self.probe, self.epoch = big, small, probe, 0
        self.x, self.y = _samples(big * 4, seed)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.probe:  # every DataLoader worker, before its own batches (a worker's batches may come first)
            record("start", [self.epoch])
        rank, _ = _rank()
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        first, count = rank * self.big, self.big if rank == 0 else self.small
        for i in range(first + worker, first + count, workers):
            yield self.x[i], self.y[i]


class Nothing(IterableDataset):
    """A stream that yields nothing."""

    def __iter__(self):
        return iter(())


def record(kind: str, ids: list[int]) -> None:
    folder = os.environ.get("STREAM_PROBE_DIR")
    if folder:
        rank = int(os.environ.get("RANK", "0"))
        with open(Path(folder) / f"rank{rank}.txt", "a") as f:
            f.write(f"{kind} " + " ".join(map(str, ids)) + "\n")


class ProbeCollate:
    """torch's default_collate, recording the ids (the input's first column) of every batch it makes as `kind`."""

    def __init__(self, kind: str = "batch"):
        self.kind = kind

    def __call__(self, samples):
        batch = default_collate(samples)
        record(self.kind, [int(i) for i in batch[0][:, 0].tolist()])
        return batch


class FitMark(Callback):
    """Marks in each rank's probe file where training starts (the driver's and the workers' checks of the data read
    and collate samples before)."""

    def on_fit_start(self, trainer) -> None:
        record("fit", [])


def trained_epochs(lines: list[str]) -> list[list[int]]:
    """The ids of the batches made in each epoch after the last `fit` mark: one list per epoch ("start e" lines). A
    DataLoader worker may mark its start before the trainer marks `fit` (workers prefetch as soon as the loader's
    iterator exists): its batches after the mark belong to the last start written before it."""
    fit = max(i for i, line in enumerate(lines) if line.startswith("fit"))
    epochs: dict[int, list[int]] = {}
    current = None
    for index, line in enumerate(lines):
        kind, *values = line.split()
        if kind == "start":
            current = int(values[0])
            if index > fit:
                epochs.setdefault(current, [])
        elif kind == "batch" and index > fit:
            epochs.setdefault(current, []).extend(int(v) for v in values)
    return [epochs[e] for e in sorted(epochs)]


class IdBlindMLP(nn.Module):
    """An MLP on every input column but the id."""

    def __init__(self, in_shape, num_classes: int, hidden: int = 16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_shape[0] - 1, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.head(self.body(x[:, 1:]))
