"""dataset.name -> Splits. Every worker builds the same tensors (files or seeded random data)."""
from __future__ import annotations

from omegaconf import DictConfig

from framework.data.splits import Splits
from framework.data.synthetic import make_synthetic
from framework.data.vision import load_cifar10, load_idx_dataset

DATASET_NAMES = ("fashion_mnist", "mnist", "cifar10", "synthetic")


def load_splits(cfg: DictConfig) -> Splits:
    name = cfg.name
    if name == "synthetic":
        splits = make_synthetic(list(cfg.shape), cfg.num_classes, cfg.train_size, cfg.test_size, cfg.noise, cfg.seed)
    elif name == "cifar10":
        splits = load_cifar10(cfg.root, cfg.download, cfg.download_dir)
    else:
        splits = load_idx_dataset(name, cfg.root, cfg.download, cfg.download_dir)
    return splits.limited(cfg.max_train_samples, cfg.max_test_samples)
