"""dataset.name -> Splits. Every worker builds the same tensors (files or seeded random data)."""
from __future__ import annotations

from omegaconf import DictConfig

from framework.data.splits import Splits
from framework.data.synthetic import make_synthetic
from framework.data.vision import check_cifar10, check_idx_dataset, load_cifar10, load_idx_dataset

DATASET_NAMES = ("fashion_mnist", "mnist", "cifar10", "synthetic")
_FILE_DATASET_FACTS = {"fashion_mnist": ((1, 28, 28), 10), "mnist": ((1, 28, 28), 10), "cifar10": ((3, 32, 32), 10)}
_FILE_DATASET_TRAIN_SIZE = {"fashion_mnist": 60000, "mnist": 60000, "cifar10": 50000}


def input_facts(cfg: DictConfig) -> tuple[tuple[int, ...], int]:
    """(sample shape, class count) without reading any file, for driver-side checks."""
    if cfg.name == "synthetic":
        return tuple(cfg.shape), cfg.num_classes
    return _FILE_DATASET_FACTS[cfg.name]


def train_size(cfg: DictConfig) -> int:
    """Training samples a run will use, without reading any file."""
    full = cfg.train_size if cfg.name == "synthetic" else _FILE_DATASET_TRAIN_SIZE[cfg.name]
    return min(full, cfg.max_train_samples or full)


def load_splits(cfg: DictConfig) -> Splits:
    name = cfg.name
    if name == "synthetic":
        splits = make_synthetic(list(cfg.shape), cfg.num_classes, cfg.train_size, cfg.test_size, cfg.noise, cfg.seed)
    elif name == "cifar10":
        splits = load_cifar10(cfg.root, cfg.download, cfg.download_dir)
    else:
        splits = load_idx_dataset(name, cfg.root, cfg.download, cfg.download_dir)
    return splits.limited(cfg.max_train_samples, cfg.max_test_samples)


def prepare_dataset(cfg: DictConfig) -> None:
    """Driver-side, before any worker starts: find the files (downloading them once if allowed) and
    check that none is truncated, so N workers neither download in parallel nor fail one by one."""
    if cfg.name == "cifar10":
        check_cifar10(cfg.root, cfg.download, cfg.download_dir)
    elif cfg.name != "synthetic":
        check_idx_dataset(cfg.name, cfg.root, cfg.download, cfg.download_dir)
