import gzip
import struct

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from framework.data.idx import read_idx
from framework.data.registry import load_splits
from framework.errors import ConfigError

FASHION = "/usr/share/datasets/fashion-mnist"


def write_idx(path, array: np.ndarray, truncate: int = 0):
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    with gzip.open(path, "wb") as f:
        f.write(data[: len(data) - truncate])


def test_idx_roundtrip(tmp_path):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "x.gz", images)
    assert np.array_equal(read_idx(tmp_path / "x.gz"), images)


def test_truncated_idx_is_refused_with_the_file_named(tmp_path):
    write_idx(tmp_path / "x.gz", np.zeros((5, 28, 28), np.uint8), truncate=100)
    with pytest.raises(ConfigError, match=r"x.gz is truncated or corrupt"):
        read_idx(tmp_path / "x.gz")


def test_fashion_mnist_from_the_debian_package():
    cfg = OmegaConf.create({"name": "fashion_mnist", "root": None, "download": False, "download_dir": None,
                            "max_train_samples": None, "max_test_samples": None})
    splits = load_splits(cfg)
    assert splits.train_x.shape == (60000, 1, 28, 28) and splits.test_x.shape == (10000, 1, 28, 28)
    assert splits.train_x.dtype == torch.uint8 and splits.num_classes == 10
    assert sorted(splits.train_y.unique().tolist()) == list(range(10))


def test_missing_dataset_names_what_was_tried(tmp_path):
    cfg = OmegaConf.create({"name": "mnist", "root": str(tmp_path / "nowhere"), "download": False,
                            "download_dir": str(tmp_path / "dl"), "max_train_samples": None, "max_test_samples": None})
    with pytest.raises(ConfigError) as err:
        load_splits(cfg)
    message = str(err.value)
    assert "nowhere" in message and "dataset=synthetic" in message and "download=false" in message
