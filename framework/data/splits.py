"""What every dataset hands to the trainer: train and test tensors plus the facts models need."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Splits:
    train_x: torch.Tensor  # N x C x H x W (uint8 images) or N x D (float features)
    train_y: torch.Tensor  # int64 class ids
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]  # per channel, after scaling
    std: tuple[float, ...]
    scale: float = 1.0  # 1/255 for uint8 pixels

    @property
    def in_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    def limited(self, max_train: int | None, max_test: int | None) -> "Splits":
        return Splits(
            self.train_x[:max_train], self.train_y[:max_train], self.test_x[:max_test], self.test_y[:max_test],
            self.num_classes, self.mean, self.std, self.scale,
        )


