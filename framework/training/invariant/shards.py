"""Which micro-shards a rank owns, its micro-batch cut into them, and its owned gradients checked against the shard
count."""
from __future__ import annotations

import torch

from framework.common.errors import ConfigError
from framework.data.batches import tree_map


def owned_shards(rank: int, world_size: int, shards: int) -> range:
    """The shards rank `rank` of `world_size` computes: k = rank, rank + W, ... (the sampler deals rank r the batch
    positions r mod W, and shard k holds the positions k mod K, so with W dividing K they are exactly these)."""
    if shards % world_size:
        raise ConfigError(f"trainer.micro_shards={shards} is not allowed with {world_size} data-parallel ranks: it "
                          f"must be a multiple of the number of ranks")
    return range(rank, shards, world_size)


def check_owned(owned: list[list[torch.Tensor]], world_size: int, shards: int) -> None:
    """owned[i] is shard rank + i*W's gradient, one tensor per parameter, every shard the same shapes."""
    if len(owned) * world_size != shards:
        raise ValueError(f"{len(owned)} shard gradients on each of {world_size} ranks do not make {shards} shards")
    first = [t.shape for t in owned[0]]
    if any([t.shape for t in grads] != first for grads in owned):
        raise ValueError("every shard's gradient must hold the same tensors (shapes) in the same order")


def rank_shards(micro_batch, rank: int, world_size: int, shards: int) -> list[tuple[int, object]]:
    """A rank's micro-batch (any nesting of tensors, batch first) as its micro-shards: (k, shard k's samples).

    The sampler deals rank r the global batch's positions r, r + W, ...; the rank's sample j sits at position
    W j + r, in shard (W j + r) mod K, so its t-th owned shard (k = r + t W) is its samples t, t + K/W, ...: each in
    the order the global batch holds them (shard k = batch[k::K])."""
    owned = owned_shards(rank, world_size, shards)
    stride = len(owned)
    return [(k, tree_map(lambda t, i=i: t[i::stride], micro_batch)) for i, k in enumerate(owned)]
