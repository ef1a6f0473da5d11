"""Test-only components that show which samples a run trained: a dataset whose first input column is the sample's
index, and a linear model that appends the indices of every training micro-batch it sees to a file per rank
(one line per forward, in order) under $RESUME_PROBE_DIR. Selected with dataset.train._target_ / model._target_."""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

FEATURES, CLASSES = 6, 3


class IndexedBlobs(Dataset):
    """Input [index, 6 features]; each class a prototype plus noise, so the loss curve means something."""

    def __init__(self, size: int, train: bool = True, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        prototypes = torch.randn(CLASSES, FEATURES, generator=g)
        if not train:
            torch.randn(size, FEATURES, generator=g)  # test samples differ from the train ones
        y = torch.randint(0, CLASSES, (size,), generator=g)
        features = prototypes[y] + torch.randn(size, FEATURES, generator=g)
        self.x = torch.cat([torch.arange(size, dtype=torch.float32).unsqueeze(1), features], 1)
        self.y = y
        self.in_shape, self.num_classes = (FEATURES + 1,), CLASSES

    def tensors(self):
        return self.x, self.y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class IndexRecorder(nn.Module):
    def __init__(self, in_shape, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(in_shape[0] - 1, num_classes)

    def forward(self, x):
        folder = os.environ.get("RESUME_PROBE_DIR")
        if self.training and folder and torch.is_grad_enabled():  # not the driver's no-grad check of the model
            rank = int(os.environ.get("RANK", "0"))
            with open(Path(folder) / f"rank{rank}.txt", "a") as f:
                f.write(" ".join(str(int(i)) for i in x[:, 0].tolist()) + "\n")
        return self.fc(x[:, 1:])
