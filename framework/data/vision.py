"""Fashion-MNIST, MNIST and CIFAR-10 from local files first, torchvision's download second."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from framework.data.decoded_cache import cached_decode
from framework.data.idx import check_idx_header, read_idx
from framework.data.splits import Splits
from framework.errors import ConfigError

_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

# name -> (torchvision class, well-known local folders, mean, std)
_IDX_DATASETS = {
    "fashion_mnist": ("FashionMNIST", ["/usr/share/datasets/fashion-mnist"], (0.2860,), (0.3530,)),
    "mnist": ("MNIST", ["/usr/share/datasets/mnist"], (0.1307,), (0.3081,)),
}


def default_download_dir() -> Path:
    return Path(os.environ.get("HYDRA_DIST_DATA", Path.home() / ".cache" / "hydra-dist" / "datasets"))


def _idx_file(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _idx_candidates(root: str | None, tv_name: str, well_known: list[str], download_dir: Path) -> list[Path]:
    folders: list[Path] = []
    if root:
        folders += [Path(root), Path(root) / tv_name / "raw"]
    folders += [Path(p) for p in well_known]
    folders.append(download_dir / tv_name / "raw")
    return folders


def _no_data_error(name: str, tried: list[str], download_note: str) -> ConfigError:
    return ConfigError(
        f"dataset={name}: no usable files found. Tried: {'; '.join(tried)}. {download_note} "
        f"Set dataset.root to a folder with the files, or use dataset=synthetic to train on random data."
    )


def locate_idx_files(name: str, root: str | None, download: bool, download_dir: str | None) -> list[Path]:
    """The four IDX files of `name`, found locally or downloaded with torchvision (in the driver, once)."""
    tv_name, well_known, _, _ = _IDX_DATASETS[name]
    target = Path(download_dir) if download_dir else default_download_dir()
    tried = []
    for folder in _idx_candidates(root, tv_name, well_known, target):
        files = [_idx_file(folder, stem) for stem in _IDX_FILES]
        if all(files):
            return files
        tried.append(str(folder))
    if not download:
        raise _no_data_error(name, tried, "dataset.download=false, so nothing was downloaded.")
    try:
        import torchvision.datasets as tvd

        for train in (True, False):
            getattr(tvd, tv_name)(str(target), train=train, download=True)
    except Exception as exc:  # no network, proxy, disk full: the user needs the summary, not the stack
        raise _no_data_error(name, tried, f"torchvision's download into {target} failed: {exc}.") from exc
    return [_idx_file(target / tv_name / "raw", stem) for stem in _IDX_FILES]


def check_idx_dataset(name: str, root: str | None, download: bool, download_dir: str | None) -> None:
    for path in locate_idx_files(name, root, download, download_dir):
        check_idx_header(path)


def load_idx_dataset(name: str, root: str | None, download: bool, download_dir: str | None) -> Splits:
    _, _, mean, std = _IDX_DATASETS[name]
    decoded = (Path(download_dir) if download_dir else default_download_dir()) / "decoded"
    return _splits_from_idx(locate_idx_files(name, root, download, download_dir), mean, std, decoded)


def _splits_from_idx(files: list[Path], mean, std, decoded: Path) -> Splits:
    train_x, train_y, test_x, test_y = (
        torch.from_numpy(cached_decode(f, read_idx, decoded) if f.suffix == ".gz" else read_idx(f).copy())
        for f in files)
    if len(train_x) != len(train_y) or len(test_x) != len(test_y):
        raise ConfigError(f"dataset files in {files[0].parent} disagree: images and labels counts differ")
    return Splits(
        train_x.unsqueeze(1), train_y.long(), test_x.unsqueeze(1), test_y.long(),
        num_classes=10, mean=mean, std=std, scale=1 / 255,
    )


_CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def _cifar_folder(root: str | None, download_dir: str | None) -> Path:
    return Path(root) if root else (Path(download_dir) if download_dir else default_download_dir())


def check_cifar10(root: str | None, download: bool, download_dir: str | None) -> None:
    folder = _cifar_folder(root, download_dir)
    if all((folder / "cifar-10-batches-py" / f).is_file() for f in _CIFAR_FILES):
        return
    if not download:
        raise _no_data_error("cifar10", [str(folder / "cifar-10-batches-py")], "dataset.download=false, so nothing was downloaded.")
    load_cifar10(root, download, download_dir)  # downloads and verifies once, in the driver


def load_cifar10(root: str | None, download: bool, download_dir: str | None) -> Splits:
    import torchvision.datasets as tvd

    folder = _cifar_folder(root, download_dir)
    try:
        train = tvd.CIFAR10(str(folder), train=True, download=download)
        test = tvd.CIFAR10(str(folder), train=False, download=download)
    except Exception as exc:
        note = "dataset.download=false, so nothing was downloaded." if not download else f"Download failed: {exc}."
        raise _no_data_error("cifar10", [str(folder / "cifar-10-batches-py")], note) from exc

    def to_tensors(ds):
        return torch.from_numpy(np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2))), torch.tensor(ds.targets)

    (train_x, train_y), (test_x, test_y) = to_tensors(train), to_tensors(test)
    return Splits(
        train_x, train_y, test_x, test_y, num_classes=10,
        mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616), scale=1 / 255,
    )
