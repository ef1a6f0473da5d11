"""What the hand-written baselines share: train.py's default model (LeNet, d2l layout) and Fashion-MNIST's
IDX files read into memory. Plain PyTorch and numpy; never imports framework."""
import gzip
from pathlib import Path

import numpy as np
import torch
from torch import nn

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
MEAN, STD = 0.2860, 0.3530  # of the training pixels, scaled to [0, 1]


def lenet(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3), nn.ReLU(), nn.AvgPool2d(2, 2),
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(), nn.AvgPool2d(2, 2),
        nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, num_classes),
    )


def read_idx(path: Path) -> torch.Tensor:
    data = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims).copy())


def training_split(folder: Path = FASHION_MNIST) -> tuple[torch.Tensor, torch.Tensor]:
    """(N x 1 x 28 x 28 uint8 images, N int64 labels)."""
    images = read_idx(folder / "train-images-idx3-ubyte.gz").unsqueeze(1)
    labels = read_idx(folder / "train-labels-idx1-ubyte.gz").long()
    return images, labels


def normalize(images: torch.Tensor) -> torch.Tensor:
    return (images.float() / 255 - MEAN) / STD
