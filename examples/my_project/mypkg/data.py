"""A user's own data: any map-style torch Dataset returning (input, label) works."""
import torch
from torch.utils.data import Dataset, TensorDataset


class Blobs(Dataset):
    """Gaussian blobs in `dim` dimensions, one per class; the same centers for train and test."""

    def __init__(self, train: bool = True, size: int = 512, classes: int = 3, dim: int = 8, label_offset: int = 0):
        g = torch.Generator().manual_seed(0 if train else 1)
        centers = torch.randn(classes, dim, generator=torch.Generator().manual_seed(42)) * 3
        self.y = torch.randint(0, classes, (size,), generator=g)
        self.x = centers[self.y] + torch.randn(size, dim, generator=g)
        self.y = self.y + label_offset
        self.classes = [f"blob{i}" for i in range(classes)]  # how the framework counts classes (or num_classes:)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def blobs_tensors(train: bool = True, size: int = 512):
    """A dataset built by a function. A TensorDataset gives the framework its whole split as tensors, so it
    trains from device memory (the fast path) unless dataset.in_memory=false."""
    blobs = Blobs(train, size)
    return TensorDataset(blobs.x, blobs.y)
