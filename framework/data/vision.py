"""Files of Fashion-MNIST, MNIST and CIFAR-10: found locally first, downloaded with torchvision second.

With `dataset.root` set, only that folder counts (and torchvision downloads into it when allowed): a root that
holds no usable files is an error naming it, never a silent fall-back to a copy found elsewhere. Without a
root, the usual places are searched (Debian's dataset packages, then the download folder)."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch

from framework.data.decoded_cache import cached_decode
from framework.data.idx import check_idx_header, read_idx
from framework.common.errors import ConfigError

__all__ = ["IDX_MEAN_STD", "check_idx_header", "locate_idx_files", "read_idx_split", "locate_cifar10",
           "load_cifar10_split", "default_download_dir"]

_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# kind -> torchvision class name, well-known local folders
_IDX_SOURCES = {
    "fashion_mnist": ("FashionMNIST", ["/usr/share/datasets/fashion-mnist"]),
    "mnist": ("MNIST", ["/usr/share/datasets/mnist"]),
}
IDX_MEAN_STD = {"fashion_mnist": ((0.2860,), (0.3530,)), "mnist": ((0.1307,), (0.3081,))}
_CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def default_download_dir() -> Path:
    return Path(os.environ.get("HYDRA_DIST_DATA", Path.home() / ".cache" / "hydra-dist" / "datasets"))


def _idx_file(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _no_data_error(kind: str, tried: list[str], note: str, root: str | None) -> ConfigError:
    where = (f"dataset.root={root} holds no usable {kind} files" if root
             else f"dataset={kind}: no usable files found")
    hint = ("Point dataset.root at a folder that has them, or leave it null to search the usual places"
            if root else "Set dataset.root to a folder with the files, or use dataset=synthetic to train on random data")
    return ConfigError(f"{where}. Tried: {'; '.join(tried)}. {note} {hint}.")


def _download(download: bool, folder: Path, tv_name: str, trains: tuple[bool, ...], fail) -> None:
    """torchvision's `tv_name` downloaded into folder (its splits: train in `trains`) where dataset.download allows
    it; else, or when the download fails, fail(note): the one line saying what was tried."""
    if not download:
        raise fail("dataset.download=false, so nothing was downloaded.")
    try:
        import torchvision.datasets as tvd  # slow to import, and needed only to download

        for train in trains:
            getattr(tvd, tv_name)(str(folder), train=train, download=True)
    except Exception as exc:  # no network, proxy, disk full: the user needs the summary, not the stack
        raise fail(f"torchvision's download into {folder} failed: {exc}.") from exc


def locate_idx_files(kind: str, root: str | None, download: bool, download_dir: str | None) -> list[Path]:
    """The four IDX files (train images, train labels, test images, test labels), found or downloaded once."""
    tv_name, well_known = _IDX_SOURCES[kind]
    target = Path(root) if root else (Path(download_dir) if download_dir else default_download_dir())
    folders = [Path(root), Path(root) / tv_name / "raw"] if root else (
        [Path(p) for p in well_known] + [target / tv_name / "raw"])
    tried = []
    for folder in folders:
        files = [_idx_file(folder, stem) for stem in _IDX_FILES]
        if all(files):
            return files
        tried.append(str(folder))
    _download(download, target, tv_name, (True, False), lambda note: _no_data_error(kind, tried, note, root))
    return [_idx_file(target / tv_name / "raw", stem) for stem in _IDX_FILES]


def read_idx_split(images: Path, labels: Path, download_dir: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(N x 1 x H x W uint8 images, N int64 labels) of one split; .gz files decoded once into a cache."""
    decoded = (Path(download_dir) if download_dir else default_download_dir()) / "decoded"
    x, y = (torch.from_numpy(cached_decode(f, read_idx, decoded) if f.suffix == ".gz" else read_idx(f).copy())
            for f in (images, labels))
    if len(x) != len(y):
        raise ConfigError(f"dataset files {images} and {labels} disagree: {len(x)} images, {len(y)} labels")
    return x.unsqueeze(1), y.long()


def locate_cifar10(root: str | None, download: bool, download_dir: str | None) -> Path:
    """The folder holding cifar-10-batches-py/ (downloaded into it once when allowed)."""
    folder = Path(root) if root else (Path(download_dir) if download_dir else default_download_dir())
    batches = folder / "cifar-10-batches-py"
    if all((batches / f).is_file() for f in _CIFAR_FILES):
        return folder
    _download(download, folder, "CIFAR10", (True,), lambda note: _no_data_error("cifar10", [str(batches)], note, root))
    return folder


def load_cifar10_split(folder: Path, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(N x 3 x 32 x 32 uint8 images, N int64 labels) from the python-version batch files (pickled dicts of
    `data`, N x 3072 uint8, and `labels`), as torchvision reads them."""
    images, labels = [], []
    for name in (_CIFAR_FILES[:5] if train else _CIFAR_FILES[5:]):
        path = folder / "cifar-10-batches-py" / name
        try:
            with open(path, "rb") as f:
                batch = pickle.load(f, encoding="latin1")
            data = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
            targets = np.asarray(batch.get("labels", batch.get("fine_labels")), dtype=np.int64)
        except Exception as exc:  # truncated pickle, wrong size, missing key: name the file
            raise ConfigError(f"dataset file {path} is not a CIFAR-10 batch ({type(exc).__name__}: {exc}); "
                              "delete it or point dataset.root elsewhere") from None
        if len(data) != len(targets):
            raise ConfigError(f"dataset file {path} holds {len(data)} images but {len(targets)} labels")
        images.append(data)
        labels.append(targets)
    return torch.from_numpy(np.concatenate(images)), torch.from_numpy(np.concatenate(labels))
