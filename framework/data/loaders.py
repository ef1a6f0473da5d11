"""Batches for one worker. Both paths shard exactly like DistributedSampler (same seed -> same indices per rank
and epoch, drop_last), so the in-memory path and the DataLoader path give the same losses.

- InMemoryLoader: the fast path, chosen by what the dataset is (its whole split available as two tensors: the
  built-ins, a TensorDataset, or a dataset with `tensors()`). The split lives as one tensor on the training
  device; a batch is an index gather plus on-device normalization. No per-sample Python, no worker processes.
  A split larger than a quarter of the GPU's free memory (every rank holds one) stays in CPU memory instead, each
  batch gathered there and copied over; the run says so.
- DataLoaderLoader: torch's DataLoader + DistributedSampler for any map-style Dataset (per-sample transforms,
  data that should not sit on the device, `trainer.num_workers`, the user's collate_fn), pinned memory and
  non-blocking copies on CUDA.
Both then run the same on-device steps (BatchPipeline) on a batch's inputs (the whole batch when samples have no
target): normalize, augment (training only), memory layout. Sharding is by sample index, so padded batches of
different lengths shard alike.
"""
from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from typing import Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler

from framework.checkpoints.position import Position
from framework.data.augment import batch_generator, loader_generator
from framework.data.batches import batch_size, leaves, take, to_device, tree_map
from framework.data.build import Data, first_samples, tensors_of
from framework.data.collate import DEFAULT, Collate
from framework.data.source import DataShare, EpochState, StepShare
from framework.data.streams import StreamLoader, eval_stream, is_stream, split_length


class BatchPipeline:
    """Device-side steps for a batch's input: raw pixels (or features) -> standardized floats and the optional
    batched augmentation (datasets that say how: one tensor per input), then channels_last for the 4-D float
    tensors of the input when the model uses it (an input of any nesting)."""

    def __init__(self, normalization, in_shape, device: torch.device, channels_last: bool = False, augment=None):
        images = in_shape is not None and len(tuple(in_shape)) == 3
        self.channels_last = channels_last
        self.augment = augment
        self.scale = None
        if normalization is not None:
            shape = (1, -1, 1, 1) if images else (1,)
            self.scale = normalization.scale
            self.mean = torch.tensor(normalization.mean, device=device).view(shape)[: None if images else 1]
            self.std = torch.tensor(normalization.std, device=device).view(shape)[: None if images else 1]

    def __call__(self, x, generator: torch.Generator | None = None):
        if not torch.is_tensor(x):  # a nesting of tensors: only the layout is ours to change
            return tree_map(_channels_last, x) if self.channels_last else x
        if self.scale is not None:
            x = (x.float() * self.scale - self.mean) / self.std
        if generator is not None and self.augment is not None:
            x = self.augment(x, generator)
        return _channels_last(x) if self.channels_last else x


def prepare(batch, pipeline: BatchPipeline, pairs: bool, generator: torch.Generator | None = None):
    """The pipeline on a batch's inputs: (pipeline(inputs), targets), or pipeline(batch) when it is inputs only."""
    if pairs:
        x, y = batch
        return pipeline(x, generator), y
    return pipeline(batch, generator)


def split_tensors(dataset, collate: Collate):
    """The split's (inputs, targets) as whole tensors where batches may be taken from them (tensors_of), unless a
    collate_fn of the user's must see its samples; None: batches come through a DataLoader."""
    return tensors_of(dataset) if not collate.own else None


def first_batch(data: Data, size: int):
    """The training split's first `size` samples (fewer where it has fewer) as one batch on the CPU, prepared as the
    loop gets them (normalized, not augmented): the driver's dry run and the plan's batch."""
    collate = data.collate["train"]
    tensors = split_tensors(data.train, collate)
    if tensors is not None:
        rows = torch.arange(min(size, split_length(data.train)))
        batch = (take(tensors[0], rows), take(tensors[1], rows))
    else:
        batch = collate.first_batch(first_samples(data.train, size), "train")
    return prepare(batch, BatchPipeline(data.normalization, data.in_shape, torch.device("cpu")), data.pairs)


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    """NHWC layout for a batch of images (4-D floats); any other tensor as it is."""
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 and t.is_floating_point() else t


def shard_indices(n: int, rank: int, world: int, epoch: int, seed: int) -> list[int]:
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
    sampler.set_epoch(epoch)
    return list(sampler)


class _Sharded:
    """The on-device steps of a rank's training batches, and the per-batch augmentation generator (seeded by the
    epoch, the rank and the batch's index): what both map-style loaders and a stream's batches go through."""

    def __init__(self, pipeline: BatchPipeline, share: DataShare, seed: int, pairs: bool = True):
        self.pipeline, self.share, self.seed, self.pairs = pipeline, share, seed, pairs
        self.device = share.device
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def prepared(self, batch, index: int):
        generator = None
        if self.pipeline.augment is not None:
            generator = batch_generator(self.device, self.seed, self.epoch, self.share.rank, index)
        return prepare(batch, self.pipeline, self.pairs, generator)


class MapSource(_Sharded, ABC):
    """A map-style split as a StepSource (framework/data/source.py): its epoch is `len(self)` micro-batches of this
    rank's shard (DistributedSampler's), `grad_accum` to a step; where it stands is counted in samples
    (framework/checkpoints/position.py), so there is no record to keep and nothing to restore."""

    def __init__(self, pipeline: BatchPipeline, share: DataShare, seed: int, pairs: bool = True):
        super().__init__(pipeline, share, seed, pairs)
        self.samples = 0  # of the epoch in progress, over every rank

    @abstractmethod
    def __len__(self) -> int:
        """This rank's micro-batches per epoch."""

    @abstractmethod
    def iterate(self, start: int) -> Iterator:
        """This epoch's micro-batches from number `start` on (resuming mid-epoch skips the ones done)."""

    def __iter__(self):
        return self.iterate(0)

    @property
    def steps_per_epoch(self) -> int:
        return len(self) // self.share.grad_accum

    def shares(self, epoch: int, start: int) -> Iterator[StepShare]:
        self.set_epoch(epoch)
        k, per_step = self.share.grad_accum, self.share.step_samples
        self.samples = start * per_step
        return self._steps(self.iterate(start * k), start, k, per_step)

    def _steps(self, batches, start: int, k: int, per_step: int) -> Iterator[StepShare]:
        for step in range(start, self.steps_per_epoch):
            self.samples += per_step
            yield StepShare(batches, k, per_step, last=step + 1 == self.steps_per_epoch)

    def state(self) -> EpochState:
        return EpochState(self.samples)

    def restore(self, position: Position) -> None:
        """Nothing to load: an epoch's order is its seed's, and shares() starts at the step the loop resumes at."""


# The most of a GPU's free memory (when the loader is built: after the model) that a training split may take there
IN_MEMORY_SHARE_OF_FREE_GPU = 0.25


def split_home(tensors, device: torch.device) -> tuple[torch.device, str]:
    """Where the in-memory path keeps a split: on the training device, or in CPU memory when it would take more than
    IN_MEMORY_SHARE_OF_FREE_GPU of the GPU's free memory (then with the line that says so)."""
    if device.type != "cuda":
        return device, ""
    size = sum(t.numel() * t.element_size() for t in leaves(tensors))
    free, _ = torch.cuda.mem_get_info(device)
    if size <= IN_MEMORY_SHARE_OF_FREE_GPU * free:
        return device, ""
    return torch.device("cpu"), (f"dataset.in_memory: the training split ({size / 2**30:.2f} GiB) is more than "
                                 f"{IN_MEMORY_SHARE_OF_FREE_GPU:.0%} of {device}'s free memory ({free / 2**30:.2f} "
                                 "GiB), so it stays in CPU memory and each batch is copied over")


class InMemoryLoader(MapSource):
    def __init__(self, x, y, pipeline: BatchPipeline, share: DataShare, seed: int, home: torch.device | None = None):
        super().__init__(pipeline, share, seed)
        self.home = home or share.device  # where the split lives (split_home)
        self.x, self.y = to_device(x, self.home), to_device(y, self.home)
        self.split_samples = batch_size(self.x)

    def __len__(self) -> int:
        return (self.split_samples // self.share.world) // self.share.micro_batch

    def iterate(self, start: int):
        share = self.share
        order = torch.tensor(shard_indices(self.split_samples, share.rank, share.world, self.epoch, self.seed),
                             device=self.home)
        for i in range(start, len(self)):
            idx = order[i * share.micro_batch:(i + 1) * share.micro_batch]
            yield self.prepared(to_device((take(self.x, idx), take(self.y, idx)), self.device), i)


class DataLoaderLoader(MapSource):
    """Any map-style dataset through a DataLoader (and its split's collate_fn), copied to the device per batch."""

    def __init__(self, dataset, pipeline: BatchPipeline, share: DataShare, seed: int, collate: Collate = DEFAULT,
                 pairs: bool = True):
        super().__init__(pipeline, share, seed, pairs)
        workers = share.num_workers
        self.sampler = DistributedSampler(dataset, num_replicas=share.world, rank=share.rank, shuffle=True, seed=seed,
                                          drop_last=True)
        self.loader = DataLoader(
            dataset, batch_size=share.micro_batch, sampler=self.sampler, drop_last=True, collate_fn=collate.fn,
            num_workers=workers, pin_memory=share.device.type == "cuda", persistent_workers=workers > 0,
            generator=loader_generator(seed, share.rank),
        )

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def iterate(self, start: int):
        for i, batch in enumerate(itertools.islice(self.loader, start, None), start):
            yield self.prepared(to_device(batch, self.device), i)


def eval_batches(dataset, share: DataShare, pipeline: BatchPipeline, collate: Collate = DEFAULT, pairs: bool = True,
                 filler=None):
    """This rank's share of the test split (rank::world: nothing padded, nothing dropped) in batches of at most
    share.micro_batch, in the same number of batches on every rank (a ZeRO-3 forward gathers parameters from every
    rank, batch by batch). Never augmented. A streaming test split (framework/data/streams.py) agrees batch by batch
    through share.peers: a rank out of data gets Fillers (`filler`: a batch of the split's kind) until all are."""
    if is_stream(dataset):
        yield from eval_stream(dataset, lambda b: prepare(b, pipeline, pairs), share, collate, filler)
        return
    device, rank, world = share.device, share.rank, share.world
    indices = torch.arange(rank, len(dataset), world)
    batches = max(1, -(-len(range(0, len(dataset), world)) // share.micro_batch))  # rank 0 holds the largest share
    tensors = split_tensors(dataset, collate)
    if tensors is not None:
        x, y = (to_device(take(t, indices), device) for t in tensors)
        for chunk in torch.arange(len(indices), device=device).tensor_split(batches):
            yield pipeline(take(x, chunk)), take(y, chunk)
        return
    chunks = [c.tolist() for c in indices.tensor_split(batches)]
    loader = DataLoader(dataset, batch_sampler=chunks, num_workers=share.num_workers, pin_memory=device.type == "cuda",
                        collate_fn=collate.fn)
    for each in loader:
        yield prepare(to_device(each, device), pipeline, pairs)


def build_train_loader(data, share: DataShare, pipeline: BatchPipeline, in_memory: bool, seed: int, say=print):
    """This rank's training split as a StepSource (framework/data/source.py): the in-memory path when the split offers
    its tensors, dataset.in_memory is on (the default) and no collate_fn of the user's must see its samples; the
    DataLoader path otherwise; a stream's (framework/data/streams.py), whose ranks agree on each step's samples
    through share.peers."""
    collate = data.collate["train"]
    if is_stream(data.train):
        return StreamLoader(data.train, _Sharded(pipeline, share, seed, data.pairs), share, collate, data.example, say)
    tensors = split_tensors(data.train, collate)
    if tensors is not None and in_memory:
        home, note = split_home(tensors, share.device)
        if note:
            say(note)
        return InMemoryLoader(*tensors, pipeline, share, seed, home=home)
    return DataLoaderLoader(data.train, pipeline, share, seed, collate, data.pairs)
