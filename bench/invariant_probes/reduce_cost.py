"""Probe of issue 58: what each exact reduction costs on gloo with W ranks (processes of this script, one thread
each), per step, for LeNet's and the char LM's gradient sizes, against ddp's plain fp32 all-reduce of one gradient:
median ms over --repeats calls (the reducers' arithmetic included: flattening, the tree sum, the integers), and the
bytes each rank sends (ring all-reduce: 2 (W-1)/W x the buffer; ring all-gather: (W-1) x the rank's part). Also:
whether gloo sums int64 exactly (the fixed-point sum's all-reduce), and both sums bitwise equal to one process's.
One JSON line from rank 0.

    PYTHONPATH=. .venv/bin/python bench/invariant_probes/reduce_cost.py --world 2"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
from shards import model_and_batch  # noqa: E402

from framework.strategies.groups import TorchGroup  # noqa: E402
from framework.training.engine import LocalGroup  # noqa: E402
from framework.training.invariant import FixedPointSum, GatheredTreeSum, owned_shards  # noqa: E402


def shapes(name: str) -> list[torch.Size]:
    model, _ = model_and_batch(name, 1)
    return [p.shape for p in model.parameters()]


def shard_gradients(name: str, k: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(k)
    return [torch.randn(s, generator=g) * 1e-3 for s in shapes(name)]


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def rank_main(rank: int, world: int, port: int, args, answer) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group, K = TorchGroup(rank, rank, world, torch.device("cpu")), args.shards
    ints = torch.tensor([2**40 + rank], dtype=torch.int64)
    dist.all_reduce(ints)
    out = {"gloo_int64_sum_exact": ints.item() == sum(2**40 + r for r in range(world))}
    for name in args.models:
        owned = [shard_gradients(name, k) for k in owned_shards(rank, world, K)]
        flat = torch.cat([torch.cat([t.reshape(-1) for t in g]) for g in owned[:1]])
        p = flat.numel()
        ms = {"ddp_fp32_all_reduce": timed(lambda: dist.all_reduce(flat.clone()), args.repeats),
              "gathered_tree_sum": timed(lambda: GatheredTreeSum(K).reduce(owned, group), args.repeats),
              "fixed_point_sum": timed(lambda: FixedPointSum(K).reduce(owned, group), args.repeats)}
        ring = 2 * (world - 1) / world
        sent = {"ddp_fp32_all_reduce": ring * 4 * p, "gathered_tree_sum": (world - 1) * (K // world) * 4 * p,
                "fixed_point_sum": ring * 8 * p + (world - 1) * 8 * len(owned[0])}
        sums = {n: [t.clone() for t in r(K).reduce(owned, group)] for n, r in
                (("gathered", GatheredTreeSum), ("fixed_point", FixedPointSum))}
        alone = LocalGroup(torch.device("cpu"))
        every = [shard_gradients(name, k) for k in range(K)]
        same = {n: all(torch.equal(a, b) for a, b in zip(sums[n], r(K).reduce(every, alone))) for n, r in
                (("gathered", GatheredTreeSum), ("fixed_point", FixedPointSum))}
        out[name] = {"parameters": p, "ms": ms, "bytes_sent_per_rank": sent, "equal_to_one_process": same}
    if rank == 0:
        answer.put(out)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--models", nargs="+", default=["lenet", "char_lm"])
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    answer, port = ctx.Queue(), int(os.environ.get("PROBE_PORT", "29611"))
    ranks = [ctx.Process(target=rank_main, args=(r, args.world, port, args, answer)) for r in range(args.world)]
    for p in ranks:
        p.start()
    result = answer.get(timeout=600)
    for p in ranks:
        p.join()
    print(json.dumps({"world": args.world, "shards": args.shards, **result}))


if __name__ == "__main__":
    main()
