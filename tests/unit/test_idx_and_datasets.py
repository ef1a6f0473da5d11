import gzip
import pickle
import struct

import numpy as np
import pytest
import torch

from framework.common.errors import ConfigError
from framework.data.builtin import Cifar10, IdxImages
from framework.data.idx import read_idx

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
    train, test = IdxImages("fashion_mnist", train=True, download=False), IdxImages("fashion_mnist", train=False, download=False)
    (x, y), (tx, _) = train.tensors(), test.tensors()
    assert x.shape == (60000, 1, 28, 28) and tx.shape == (10000, 1, 28, 28)
    assert x.dtype == torch.uint8 and train.num_classes == 10 and train.in_shape == (1, 28, 28)
    assert sorted(y.unique().tolist()) == list(range(10))
    sample, label = train[0]
    assert torch.equal(sample, x[0]) and label == int(y[0])


def _mnist_files(root, n_train=30, n_test=10):
    g = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", g.integers(0, 256, (n, 28, 28)))
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", g.integers(0, 10, (n,)))


def test_mnist_reads_generated_idx_files_from_its_root(tmp_path):
    _mnist_files(tmp_path)
    train = IdxImages("mnist", train=True, root=str(tmp_path), download=False, download_dir=str(tmp_path / "dl"))
    test = IdxImages("mnist", train=False, root=str(tmp_path), download=False, download_dir=str(tmp_path / "dl"))
    assert len(train) == 30 and len(test) == 10 and train.tensors()[0].shape == (30, 1, 28, 28)
    assert train.normalization.mean == (0.1307,)


def _cifar_files(root, per_batch=4):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    g = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": g.integers(0, 256, (per_batch, 3072), dtype=np.uint8), "labels": g.integers(0, 10, per_batch).tolist()}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
    return folder


def test_cifar10_reads_generated_python_batches_in_channel_first_order(tmp_path):
    folder = _cifar_files(tmp_path)
    train, test = Cifar10(train=True, root=str(tmp_path), download=False), Cifar10(train=False, root=str(tmp_path), download=False)
    x, y = train.tensors()
    assert x.shape == (20, 3, 32, 32) and len(test) == 4 and y.dtype == torch.int64
    with open(folder / "data_batch_1", "rb") as f:
        first = pickle.load(f)["data"][0]
    assert torch.equal(x[0], torch.from_numpy(first.reshape(3, 32, 32)))  # red plane, then green, then blue
    (folder / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match="test_batch is not a CIFAR-10 batch"):
        Cifar10(train=False, root=str(tmp_path), download=False).tensors()


def test_an_explicit_root_without_the_files_is_an_error_naming_it_never_another_copy(tmp_path):
    """Debian's Fashion-MNIST is installed here, and must not be used when dataset.root points elsewhere."""
    for root in (tmp_path / "nowhere", tmp_path / "garbage"):
        if root.name == "garbage":
            root.mkdir()
            (root / "train-images-idx3-ubyte.gz").write_bytes(b"garbage")
        with pytest.raises(ConfigError) as err:
            IdxImages("fashion_mnist", root=str(root), download=False)
        assert f"dataset.root={root} holds no usable fashion_mnist files" in str(err.value)
        assert "/usr/share/datasets" not in str(err.value)


def test_missing_dataset_names_what_was_tried(tmp_path):
    with pytest.raises(ConfigError) as err:
        IdxImages("mnist", root=None, download=False, download_dir=str(tmp_path / "dl"))
    message = str(err.value)
    assert "/usr/share/datasets/mnist" in message and "dataset=synthetic" in message and "download=false" in message
