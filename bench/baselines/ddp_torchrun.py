"""Hand-written baseline for bench/overhead.py and bench/startup.py: a DistributedDataParallel script as
the torchrun tutorials write it, doing train.py's default work on CPU workers (gloo). LeNet, Adam, a
global batch split over the workers, Fashion-MNIST in memory, each rank taking rank::world of the same
per-epoch permutation (DistributedSampler's order). Never imports framework (shared pieces: lenet_fashion_mnist.py).

    torchrun --standalone --nproc_per_node=2 bench/baselines/ddp_torchrun.py --steps 400 --log-every 100
    ... --dataloader   the tutorials' input path instead: DataLoader + DistributedSampler over a TensorDataset

Rank 0 prints 'training ...' right before the loop and 'step S/T | loss L' every --log-every steps.
"""
import argparse
import itertools
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from lenet_fashion_mnist import FASHION_MNIST, lenet, normalize, training_split


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=FASHION_MNIST)
    p.add_argument("--batch-size", type=int, default=128, help="global batch, summed over the workers")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--dataloader", action="store_true", help="DataLoader + DistributedSampler input path")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    images, labels = training_split(args.data_dir)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(lenet())
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    micro_batch = args.batch_size // world
    per_rank = len(images) // world
    steps_per_epoch = per_rank // micro_batch

    if rank == 0:
        print(f"training LeNet, torchrun DDP: {world} workers x {micro_batch}, {args.steps} steps, "
              f"{torch.get_num_threads()} threads per worker", flush=True)
    model.train()
    step, epoch, loss_sum = 0, 0, torch.zeros(())
    if args.dataloader:
        sampler = DistributedSampler(TensorDataset(images, labels), num_replicas=world, rank=rank, seed=args.seed,
                                     drop_last=True)
        loader = DataLoader(TensorDataset(images, labels), batch_size=micro_batch, sampler=sampler, drop_last=True)
    while step < args.steps:
        if args.dataloader:
            sampler.set_epoch(epoch)
            batches = ((normalize(x), y) for x, y in loader)
        else:
            order = torch.randperm(len(images), generator=torch.Generator().manual_seed(args.seed + epoch))
            shard = order[rank:per_rank * world:world]
            batches = ((normalize(images[idx]), labels[idx])
                       for idx in (shard[i * micro_batch:(i + 1) * micro_batch] for i in range(steps_per_epoch)))
        for x, y in itertools.islice(batches, min(steps_per_epoch, args.steps - step)):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            step += 1
            if step % args.log_every == 0 and rank == 0:
                print(f"step {step}/{args.steps} | loss {loss_sum.item() / args.log_every:.4f}", flush=True)
                loss_sum.zero_()
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
