"""Test-only: a map-style dataset whose per-sample transform draws random numbers in the DataLoader's worker
processes (a random shift and noise from torch's global generator, a random sign from numpy's), and that offers no
whole tensors, so its batches always come through a DataLoader (tests/runs/test_determinism.py)."""
import numpy as np
import torch
from torch.utils.data import Dataset


class Jittered(Dataset):
    def __init__(self, size: int = 512, num_classes: int = 4, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, num_classes, (size,), generator=g)
        prototypes = torch.randn(num_classes, 1, 8, 8, generator=g)
        self.images = prototypes[self.targets] + 0.5 * torch.randn(size, 1, 8, 8, generator=g)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i):
        shift = int(torch.randint(-2, 3, ()))
        sign = float(np.random.choice([-1.0, 1.0]))
        x = torch.roll(self.images[i], shift, dims=-1) * sign + 0.1 * torch.randn(1, 8, 8)
        return x, int(self.targets[i])
