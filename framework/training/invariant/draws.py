"""A micro-shard's random draws keyed by (seed, step, shard), not by the rank that trains it: dropout (nn.Dropout,
F.dropout, scaled_dot_product_attention's dropout_p) draws from the default generators, so seeding them for the
shard's forward and backward gives its samples the same masks on every world size, with no change to the model.
The caller's generators are left where they were (torch.random.fork_rng)."""
from __future__ import annotations

import contextlib

import torch


def shard_key(seed: int, step: int, shard: int) -> int:
    return ((seed * 1_000_003 + step) * 65_537 + shard) % 2**63


@contextlib.contextmanager
def shard_draws(seed: int, step: int, shard: int, devices: list[torch.device]):
    """Inside: the CPU generator and those of `devices` (GPUs) seeded by the shard's key; after: as before."""
    cuda = [d.index for d in devices if d.type == "cuda"]
    with torch.random.fork_rng(devices=cuda, device_type="cuda"):
        torch.manual_seed(shard_key(seed, step, shard))
        yield


AUGMENT_SALT = 0x2545F4914F6CDD1D  # keeps a shard's augmentation draws apart from its dropout draws (same key)


def augment_key(seed: int, epoch: int, step: int, shard: int) -> int:
    """The seed of a micro-shard's augmentation generator: where the shard is, not which rank trains it."""
    return (shard_key(seed, step, shard) ^ AUGMENT_SALT ^ (epoch * 0x9E3779B1)) % 2**63
