"""Random data like the RandomDataset of the DataParallel tutorial, but learnable: each class has a
random prototype and samples are prototype + noise, so a loss curve means something."""
from __future__ import annotations

import torch

from framework.data.splits import Splits


def make_synthetic(shape: list[int], num_classes: int, train_size: int, test_size: int, noise: float, seed: int) -> Splits:
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(num_classes, *shape, generator=g)

    def draw(n: int):
        y = torch.randint(0, num_classes, (n,), generator=g)
        x = prototypes[y] + noise * torch.randn(n, *shape, generator=g)
        return x, y

    train_x, train_y = draw(train_size)
    test_x, test_y = draw(test_size)
    channels = shape[0] if len(shape) == 3 else 1
    return Splits(train_x, train_y, test_x, test_y, num_classes, mean=(0.0,) * channels, std=(1.0,) * channels)
