"""Test-only: a model whose forward runs max_unpool2d, an op torch has no deterministic CPU kernel for (it raises
under torch.use_deterministic_algorithms(True); tests/unit/test_determinism.py)."""
import torch.nn.functional as F
from torch import nn


class Unpooling(nn.Module):
    def __init__(self, in_shape=(1, 28, 28), num_classes: int = 10):
        super().__init__()
        channels, height, width = in_shape
        self.head = nn.Linear(channels * height * width, num_classes)

    def forward(self, x):
        pooled, where = F.max_pool2d(x, 2, return_indices=True)
        return self.head(F.max_unpool2d(pooled, where, 2, output_size=x.shape[-2:]).flatten(1))
