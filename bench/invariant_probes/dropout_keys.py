"""Probe of issue 58: dropout's draws keyed by (seed, step, shard) without touching the user's model. Each shard's
forward runs inside torch.random.fork_rng() after torch.manual_seed(key(seed, step, shard)): nn.Dropout, F.dropout
and scaled_dot_product_attention's dropout all draw from the default generator, so their masks follow the key. Checks:
the same key gives the same masks at 1 and 2 threads and with other draws before it; fork_rng leaves the caller's
generator where it was. Prints one JSON line.

    PYTHONPATH=. .venv/bin/python bench/invariant_probes/dropout_keys.py"""
from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from torch import nn


def key(seed: int, step: int, shard: int) -> int:
    return ((seed * 1_000_003 + step) * 65_537 + shard) % (2**63)


def draws(threads: int, noise_before: int) -> list[torch.Tensor]:
    torch.set_num_threads(threads)
    torch.rand(noise_before)  # whatever the process drew before: must not matter
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(key(0, 7, 3))
        x = torch.ones(8, 4096)
        q = torch.ones(8, 4, 64, 32)
        return [nn.Dropout(0.1).train()(x), F.dropout(x, 0.5, training=True),
                F.scaled_dot_product_attention(q, q, q, dropout_p=0.2, is_causal=True)]


def main() -> None:
    reference = draws(1, 0)
    torch.manual_seed(5)
    draws(1, 3)
    after_fork = torch.rand(4)
    torch.manual_seed(5)
    torch.rand(3)
    restored = torch.equal(after_fork, torch.rand(4))
    print(json.dumps({
        "same_masks_at_2_threads": [torch.equal(a, b) for a, b in zip(reference, draws(2, 0))],
        "same_masks_after_other_draws": [torch.equal(a, b) for a, b in zip(reference, draws(1, 12345))],
        "fork_rng_restores_the_callers_generator": restored}))


if __name__ == "__main__":
    main()
