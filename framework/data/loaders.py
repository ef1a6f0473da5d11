"""Batches for one worker. Both paths shard exactly like DistributedSampler (same seed -> same
indices per rank and epoch), so the in-memory path and the DataLoader path give the same losses.

- InMemoryLoader: the whole split lives as one tensor on the training device; a batch is an index
  gather plus on-device normalization. No per-sample Python, no worker processes.
- DataLoaderLoader: torch DataLoader + DistributedSampler, for `dataset.in_memory=false`
  (per-sample work, data that should not sit on the device, `trainer.num_workers`).
"""
from __future__ import annotations

import itertools

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from framework.data.splits import Splits


class Normalizer:
    """Raw pixels (or features) to standardized floats, on the device the batch is on."""

    def __init__(self, splits: Splits, device: torch.device, channels_last: bool = False):
        images = splits.train_x.dim() == 4
        shape = (1, -1, 1, 1) if images else (-1,)
        self.mean = torch.tensor(splits.mean, device=device).view(shape)[: None if images else 1]
        self.std = torch.tensor(splits.std, device=device).view(shape)[: None if images else 1]
        self.scale = splits.scale
        self.channels_last = channels_last and images

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = (x.float() * self.scale - self.mean) / self.std
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x


def shard_indices(n: int, rank: int, world: int, epoch: int, seed: int) -> list[int]:
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
    sampler.set_epoch(epoch)
    return list(sampler)


class InMemoryLoader:
    def __init__(self, x, y, normalizer: Normalizer, device, micro_batch: int, rank: int, world: int, seed: int):
        self.x = x.to(device, non_blocking=True)
        self.y = y.to(device, non_blocking=True)
        self.normalizer, self.device = normalizer, device
        self.micro_batch, self.rank, self.world, self.seed = micro_batch, rank, world, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return (len(self.x) // self.world) // self.micro_batch

    def __iter__(self):
        return self.iterate(0)

    def iterate(self, start: int):
        """This epoch's micro-batches from number `start` on (resuming mid-epoch skips the ones done)."""
        order = torch.tensor(shard_indices(len(self.x), self.rank, self.world, self.epoch, self.seed), device=self.device)
        for i in range(start, len(self)):
            idx = order[i * self.micro_batch:(i + 1) * self.micro_batch]
            yield self.normalizer(self.x[idx]), self.y[idx]


class DataLoaderLoader:
    """The same batches, produced by a DataLoader from host memory and copied to the device per batch."""

    def __init__(self, x, y, normalizer: Normalizer, device, micro_batch, rank, world, seed, num_workers: int):
        self.normalizer, self.device = normalizer, device
        dataset = TensorDataset(x, y)
        self.sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.loader = DataLoader(
            dataset, batch_size=micro_batch, sampler=self.sampler, drop_last=True,
            num_workers=num_workers, pin_memory=device.type == "cuda", persistent_workers=num_workers > 0,
        )

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        return self.iterate(0)

    def iterate(self, start: int):
        for x, y in itertools.islice(self.loader, start, None):
            yield self.normalizer(x.to(self.device, non_blocking=True)), y.to(self.device, non_blocking=True)


def eval_batches(x, y, normalizer: Normalizer, device, batch: int, rank: int, world: int):
    """This rank's share of the test split (rank::world: nothing padded, nothing dropped), in the same number
    of batches on every rank (a ZeRO-3 forward gathers parameters from every rank, batch by batch)."""
    batches = -(-len(x[0::world]) // batch)  # rank 0 holds the largest share
    x, y = x[rank::world].to(device), y[rank::world].to(device)
    for xs, ys in zip(x.tensor_split(batches), y.tensor_split(batches)):
        yield normalizer(xs), ys


def build_train_loader(splits: Splits, cfg, normalizer: Normalizer, device, micro_batch: int, rank: int, world: int):
    args = (splits.train_x, splits.train_y, normalizer, device, micro_batch, rank, world, cfg.trainer.seed)
    if cfg.dataset.in_memory:
        return InMemoryLoader(*args)
    return DataLoaderLoader(*args, num_workers=cfg.trainer.num_workers)
