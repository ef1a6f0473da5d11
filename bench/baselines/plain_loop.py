"""Hand-written baseline for bench/overhead.py and bench/startup.py: the plainest single-process PyTorch
loop doing the work bench/overhead.py asks of train.py. LeNet, Adam, Fashion-MNIST already in memory as one
uint8 tensor, a fresh permutation per epoch, normalization per batch. Never imports framework (shared pieces: lenet_fashion_mnist.py).

    python bench/baselines/plain_loop.py --steps 400 --log-every 100

Prints 'training ...' right before the loop and 'step S/T | loss L' every --log-every steps (the same
markers train.py prints), so the benchmark times both from the same output lines.
"""
import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from lenet_fashion_mnist import FASHION_MNIST, lenet, normalize, training_split


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=FASHION_MNIST)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()

    images, labels = training_split(args.data_dir)
    torch.manual_seed(args.seed)
    model = lenet()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    steps_per_epoch = len(images) // args.batch_size

    print(f"training LeNet, plain loop: batch {args.batch_size}, {args.steps} steps, "
          f"{torch.get_num_threads()} threads", flush=True)
    model.train()
    step, epoch, loss_sum = 0, 0, torch.zeros(())
    while step < args.steps:
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(args.seed + epoch))
        for i in range(min(steps_per_epoch, args.steps - step)):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            x = normalize(images[idx])
            loss = F.cross_entropy(model(x), labels[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            step += 1
            if step % args.log_every == 0:
                print(f"step {step}/{args.steps} | loss {loss_sum.item() / args.log_every:.4f}", flush=True)
                loss_sum.zero_()
        epoch += 1


if __name__ == "__main__":
    main()
