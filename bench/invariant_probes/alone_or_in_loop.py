"""Probe 1 and 2 of issue 58: is each micro-shard's gradient bitwise the same computed alone (a fresh model, only
that shard) as inside a rank's loop (shards r, r+W, ... one after the other, for W = 1, 2, 4), and the same in
another process? Prints one JSON line: per world size the shards whose gradient differs from its alone value, and
each shard's digest (compare the digests of two processes, or of two thread counts).

    PYTHONPATH=. .venv/bin/python bench/invariant_probes/alone_or_in_loop.py --model lenet --threads 1"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from shards import digest, model_and_batch, shard, shard_gradient  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["lenet", "char_lm"], default="lenet")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dropout", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    K, B = args.shards, args.batch
    alone = {}
    for k in range(K):
        model, batch = model_and_batch(args.model, B, args.dropout)
        torch.manual_seed(1000 + k)  # the shard's own draws (dropout): keyed by the shard, not the rank
        alone[k] = shard_gradient(model, shard(batch, k, K), B)
    differs = {}
    for world in (1, 2, 4):
        wrong = []
        for rank in range(world):
            model, batch = model_and_batch(args.model, B, args.dropout)
            for k in range(rank, K, world):
                torch.manual_seed(1000 + k)
                g = shard_gradient(model, shard(batch, k, K), B)
                if not all(torch.equal(a, b) for a, b in zip(g, alone[k])):
                    wrong.append(k)
        differs[world] = wrong
    # the same samples as ONE batch of 2 shards: a different shape, so not the same as the two shards' sum
    model, batch = model_and_batch(args.model, B, args.dropout)
    two = shard_gradient(model, tuple(torch.cat([a, b]) for a, b in zip(shard(batch, 0, K), shard(batch, 1, K))), B)
    pair = [a + b for a, b in zip(alone[0], alone[1])]
    max_gap = max((x - y).abs().max().item() for x, y in zip(two, pair))
    print(json.dumps({"model": args.model, "threads": args.threads, "dropout": args.dropout,
                      "shards_differing_from_alone": differs,
                      "two_shards_as_one_batch_vs_their_sum_max_abs_gap": max_gap,
                      "digests": {k: digest(g) for k, g in alone.items()}}))


if __name__ == "__main__":
    main()
