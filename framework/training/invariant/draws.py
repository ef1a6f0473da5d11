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
