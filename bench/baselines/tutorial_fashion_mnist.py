"""Hand-written baseline for bench/time_to_accuracy.py: Fashion-MNIST trained the way the PyTorch tutorials
write it (the seed-style script): torchvision's FashionMNIST with transform=ToTensor(), a
DataLoader(batch_size=64, shuffle=True), loss.item() every step, a test pass after every epoch. The
model and optimizer are train.py's defaults (LeNet, Adam lr 1e-3). Never imports framework.

    python bench/baselines/tutorial_fashion_mnist.py --epochs 10

torchvision's download needs the internet; offline, --idx-dir's .gz files are extracted once into
torchvision's folder layout under --root (run with --prepare-only to do just that, untimed).
Prints 'training ...' before the first epoch and 'epoch E/N test loss L | test accuracy A' after each.
"""
import argparse
import gzip
import shutil
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets
from torchvision.transforms import ToTensor

from lenet_fashion_mnist import FASHION_MNIST, lenet

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def stage_offline_copy(idx_dir: Path, root: Path) -> None:
    """What torchvision's download would leave in root/FashionMNIST/raw, made from local .gz files."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name in IDX_FILES:
        if not (raw / name).exists() and (idx_dir / f"{name}.gz").exists():
            with gzip.open(idx_dir / f"{name}.gz") as src, open(raw / name, "wb") as dst:
                shutil.copyfileobj(src, dst)


def train(dataloader, model, loss_fn, optimizer):
    model.train()
    for batch, (X, y) in enumerate(dataloader):
        pred = model(X)
        loss = loss_fn(pred, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss = loss.item()
        if batch % 100 == 0:
            print(f"loss: {loss:>7f}  [{(batch + 1) * len(X):>5d}/{len(dataloader.dataset):>5d}]", flush=True)


def test(dataloader, model, loss_fn):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for X, y in dataloader:
            pred = model(X)
            test_loss += loss_fn(pred, y).item()
            correct += (pred.argmax(1) == y).type(torch.float).sum().item()
    return test_loss / len(dataloader), correct / len(dataloader.dataset)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--root", type=Path, default=Path.home() / ".cache" / "hydra-dist-bench" / "torchvision")
    p.add_argument("--idx-dir", type=Path, default=FASHION_MNIST)
    p.add_argument("--prepare-only", action="store_true", help="stage the offline copy and exit")
    args = p.parse_args()

    stage_offline_copy(args.idx_dir, args.root)
    if args.prepare_only:
        return
    torch.manual_seed(args.seed)
    training_data = datasets.FashionMNIST(root=args.root, train=True, download=True, transform=ToTensor())
    test_data = datasets.FashionMNIST(root=args.root, train=False, download=True, transform=ToTensor())
    train_dataloader = DataLoader(training_data, batch_size=64, shuffle=True)
    test_dataloader = DataLoader(test_data, batch_size=64)

    model = lenet()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    print(f"training LeNet, tutorial style: batch 64, {args.epochs} epochs", flush=True)
    for t in range(args.epochs):
        train(train_dataloader, model, loss_fn, optimizer)
        test_loss, accuracy = test(test_dataloader, model, loss_fn)
        print(f"epoch {t + 1}/{args.epochs} test loss {test_loss:.4f} | test accuracy {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
