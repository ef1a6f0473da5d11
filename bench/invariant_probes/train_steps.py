"""Probe of issue 58's loop design, outside the loop: W ranks (processes of this script, gloo) train N steps of LeNet
or the char LM (dropout on) with AdamW and gradient clipping the way the mode would. Each step the framework's own
dealing (shard_indices) gives rank r its micro-batch of the global batch; rank_shards cuts it into its micro-shards;
each shard's forward and backward run under shard_draws (dropout keyed by seed, step, shard) and DDP's no_sync (W > 1:
DDP never reduces), its gradient is stashed; the reducer sums the K shards; the step's loss is the tree sum of the K
shards' loss sums (gathered). Prints one JSON line from rank 0: every step's loss (hex) and the final weights' digest,
to compare across --world 1, 2, 4.

    PYTHONPATH=. .venv/bin/python bench/invariant_probes/train_steps.py --world 2 --model char_lm"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from shards import model_and_batch, shard_loss  # noqa: E402

from framework.data.loaders import shard_indices  # noqa: E402
from framework.strategies.groups import TorchGroup  # noqa: E402
from framework.training.engine import LocalGroup  # noqa: E402
from framework.training.invariant import (FixedPointSum, GatheredTreeSum, rank_shards, shard_draws,  # noqa: E402
                                          tree_sum)

SAMPLES, BATCH = 512, 64
REDUCERS = {"fixed_point": FixedPointSum, "gathered": GatheredTreeSum}


def rank_main(rank: int, world: int, port: int, args, answer) -> None:
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        group = TorchGroup(rank, rank, world, cpu)
    else:
        group = LocalGroup(cpu)
    model, data = model_and_batch(args.model, SAMPLES, dropout=0.1)
    trained = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    reducer, K, micro = REDUCERS[args.reduce](args.shards), args.shards, BATCH // world
    losses, start = [], time.perf_counter()
    for step in range(args.steps):
        epoch, i = divmod(step, SAMPLES // BATCH)
        ids = torch.tensor(shard_indices(SAMPLES, rank, world, epoch, seed=0)[i * micro:(i + 1) * micro])
        owned, loss_sums = [], []
        for k, part in rank_shards(tuple(t[ids] for t in data), rank, world, K):
            for p in model.parameters():
                p.grad = None
            with shard_draws(0, step, k, [cpu]), (trained.no_sync() if world > 1 else contextlib.nullcontext()):
                loss = shard_loss(trained, part, BATCH)
                loss.backward()
            owned.append([p.grad for p in model.parameters()])
            loss_sums.append(loss.detach().reshape(1))
        every = group.all_gather(torch.cat(loss_sums))  # [W, K/W]: shard k at [k % W, k // W]
        losses.append(tree_sum([every[k % world, k // world] for k in range(K)]).item().hex())
        for p, g in zip(model.parameters(), reducer.reduce(owned, group)):
            p.grad = g
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    if rank == 0:
        answer.put({"losses": losses, "weights": h.hexdigest()[:16],
                    "ms_per_step": round((time.perf_counter() - start) * 1e3 / args.steps, 1)})
    if world > 1:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--model", choices=["lenet", "char_lm"], default="lenet")
    parser.add_argument("--reduce", choices=sorted(REDUCERS), default="fixed_point")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    answer, port = ctx.Queue(), int(os.environ.get("PROBE_PORT", "29612"))
    ranks = [ctx.Process(target=rank_main, args=(r, args.world, port, args, answer)) for r in range(args.world)]
    for p in ranks:
        p.start()
    result = answer.get(timeout=900)
    for p in ranks:
        p.join()
    print(json.dumps({"world": args.world, "model": args.model, "reduce": args.reduce, "shards": args.shards,
                      **result}))


if __name__ == "__main__":
    main()
