"""The built-in datasets (Fashion-MNIST, MNIST, CIFAR-10, synthetic) as ordinary map-style torch Datasets,
named by `_target_` in conf/dataset/*.yaml exactly like a user's own.

Each also says that its whole split fits in memory as tensors (`tensors()`, raw uint8 pixels or float
features) and how to normalize them on the device (`normalization`), which is what lets the trainer keep
them on the GPU as one tensor. Files are located (and checked for truncation) when the dataset is built, in
the driver; they are decoded on first use, in the workers."""
from __future__ import annotations

import torch
from torch.utils.data import Dataset

from framework.data.vision import (IDX_MEAN_STD, check_idx_header, load_cifar10_split, locate_cifar10,
                                   locate_idx_files, read_idx_split)
from framework.config.rules import at_least, at_least_number, int_list, one_of, require


class Normalization:
    """x -> (x * scale - mean) / std, per channel."""

    def __init__(self, scale: float, mean: tuple[float, ...], std: tuple[float, ...]):
        self.scale, self.mean, self.std = scale, tuple(mean), tuple(std)


class InMemoryDataset(Dataset):
    """A split held as two tensors: raw inputs and int64 labels. Subclasses fill them on first use."""

    num_classes: int
    normalization: Normalization
    in_shape: tuple[int, ...]

    def __init__(self, transform=None):
        self.transform = transform  # per-sample, on the DataLoader path only
        self._x = self._y = None

    def _load(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._x is None:
            self._x, self._y = self._load()
        return self._x, self._y

    @property
    def targets(self) -> torch.Tensor:
        return self.tensors()[1]

    def __len__(self) -> int:
        return len(self.tensors()[0])

    def __getitem__(self, index: int):
        x, y = self.tensors()
        sample = x[index]
        return (self.transform(sample) if self.transform else sample), int(y[index])


class IdxImages(InMemoryDataset):
    """Fashion-MNIST or MNIST from their IDX files: `kind` fashion_mnist | mnist."""

    num_classes = 10
    in_shape = (1, 28, 28)

    def __init__(self, kind: str, train: bool = True, root: str | None = None, download: bool = True,
                 download_dir: str | None = None, transform=None):
        super().__init__(transform)
        require("dataset kind", kind, one_of(*IDX_MEAN_STD))
        self.kind, self.train, self.download_dir = kind, train, download_dir
        images, labels = locate_idx_files(kind, root, download, download_dir)[0 if train else 2:][:2]
        for path in (images, labels):
            check_idx_header(path)
        self.files = (images, labels)
        self.normalization = Normalization(1 / 255, *IDX_MEAN_STD[kind])

    def _load(self):
        return read_idx_split(*self.files, self.download_dir)


class Cifar10(InMemoryDataset):
    num_classes = 10
    in_shape = (3, 32, 32)
    normalization = Normalization(1 / 255, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))

    def __init__(self, train: bool = True, root: str | None = None, download: bool = True,
                 download_dir: str | None = None, transform=None):
        super().__init__(transform)
        self.train = train
        self.folder = locate_cifar10(root, download, download_dir)

    def _load(self):
        return load_cifar10_split(self.folder, self.train)


class Synthetic(InMemoryDataset):
    """Random data like the RandomDataset of the DataParallel tutorial, but learnable: each class has a random
    prototype and samples are prototype + noise, so a loss curve means something. Train and test draw from
    the same prototypes (one generator, seeded by `seed`: the train split first, then the test split)."""

    def __init__(self, shape, num_classes: int, train_size: int, test_size: int, noise: float = 1.0,
                 seed: int = 0, *, train: bool = True):
        super().__init__()
        shape = list(shape)
        for key, value, low in (("num_classes", num_classes, 2), ("train_size", train_size, 1),
                                ("test_size", test_size, 1), ("seed", seed, 0)):
            require(f"dataset.{key}", value, at_least(low))
        require("dataset.shape", shape, int_list(1))
        require("dataset.noise", noise, at_least_number(0))
        self.shape, self.num_classes, self.in_shape = shape, num_classes, tuple(shape)
        self.sizes, self.noise, self.seed, self.train = (train_size, test_size), float(noise), seed, train
        channels = shape[0] if len(shape) == 3 else 1
        self.normalization = Normalization(1.0, (0.0,) * channels, (1.0,) * channels)
        self._length = train_size if train else test_size

    def __len__(self) -> int:
        return self._length

    def _load(self):
        g = torch.Generator().manual_seed(self.seed)
        prototypes = torch.randn(self.num_classes, *self.shape, generator=g)
        splits = []
        for n in self.sizes:
            y = torch.randint(0, self.num_classes, (n,), generator=g)
            splits.append((prototypes[y] + self.noise * torch.randn(n, *self.shape, generator=g), y))
        return splits[0 if self.train else 1]
