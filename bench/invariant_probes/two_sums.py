"""Probe of issue 58: on real per-shard gradients (LeNet, the char LM; K shards of one global batch), how the two exact
reductions compare on one process: the gathered tree sum (plain float32 additions in a fixed order) and the
fixed-point sum (each shard rounded at a per-tensor scale, summed as integers, rounded once). Against the exact sum
(float64 sums of float32 shard gradients, K <= 16: exact), per model: the share of elements where the two agree
bitwise, where each is the exact sum correctly rounded to float32, and the largest gap relative to the tensor's
largest |sum|. Prints one JSON line.

    PYTHONPATH=. .venv/bin/python bench/invariant_probes/two_sums.py --model char_lm"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from shards import model_and_batch, shard, shard_gradient  # noqa: E402

from framework.training.engine import LocalGroup  # noqa: E402
from framework.training.invariant import FixedPointSum, GatheredTreeSum  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["lenet", "char_lm"], default="lenet")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    K, B = args.shards, args.batch
    model, batch = model_and_batch(args.model, B)
    owned = [shard_gradient(model, shard(batch, k, K), B) for k in range(K)]
    group = LocalGroup(torch.device("cpu"))
    tree, fixed = GatheredTreeSum(K).reduce(owned, group), FixedPointSum(K).reduce(owned, group)
    n = agree = tree_exact = fixed_exact = 0
    gap = 0.0
    for j, (a, b) in enumerate(zip(tree, fixed)):
        exact = sum(s[j].double() for s in owned)
        n += a.numel()
        agree += (a == b).sum().item()
        tree_exact += (a == exact.float()).sum().item()
        fixed_exact += (b == exact.float()).sum().item()
        gap = max(gap, ((a - b).abs().max() / exact.abs().max().clamp_min(1e-45)).item())
    print(json.dumps({"model": args.model, "shards": K, "elements": n, "bitwise_agree": agree / n,
                      "tree_is_correctly_rounded": tree_exact / n, "fixed_is_correctly_rounded": fixed_exact / n,
                      "largest_gap_over_tensor_max": gap}))


if __name__ == "__main__":
    main()
