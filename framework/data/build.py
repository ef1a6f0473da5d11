"""The dataset's typed options (framework/config/dataset.py) -> the train and test Datasets, and the facts the
model needs (input shape, classes).

A dataset config names two components, `train` and `test`, each any map-style torch Dataset returning
(input, label), built with Hydra's instantiate (so `_target_` may be a class or a factory, `_partial_` too, and
nested `_target_`s such as a torchvision transform pipeline are built first). The built-in datasets are
ordinary entries of the same mechanism."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from framework.config.components import build_component
from framework.config.dataset import DatasetConfig
from framework.errors import ConfigError

SPLITS = ("train", "test")
_SHAPE_SAMPLES = 8  # samples whose shapes are compared in the driver (all of them would read the whole dataset)
_LABEL_SAMPLES = 1024  # labels read in the driver from a dataset that has no `targets`


def build_split(cfg: DatasetConfig, which: str) -> Dataset:
    """Instantiate dataset.<which> (train or test), limited to dataset.max_<which>_samples."""
    key = f"dataset.{which}"
    node = getattr(cfg, which)
    if not isinstance(node, dict) or "_target_" not in node:
        raise ConfigError(f"{key} is missing or has no _target_: a dataset config needs `train:` and `test:` "
                          "entries, each naming a torch Dataset with _target_ (see README, Your own model and data)")
    target = node["_target_"]
    dataset = build_component(node, key)
    if callable(dataset) and not hasattr(dataset, "__getitem__"):  # `_partial_: true` on a factory
        dataset = dataset()
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise ConfigError(f"{key}._target_={target} is not allowed: it returned a {type(dataset).__name__}, not a "
                          "map-style torch Dataset (one with __len__ and __getitem__ giving (input, label))")
    if len(dataset) == 0:
        raise ConfigError(f"{key}._target_={target} is not allowed: the dataset is empty")
    limit = getattr(cfg, f"max_{which}_samples")
    if limit and limit < len(dataset):
        dataset = _limited(dataset, limit)
    return dataset


def tensors_of(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(inputs, labels) of the whole split when the dataset can give them as two tensors: a TensorDataset, or a
    dataset with `tensors()` (the built-ins); None for anything else, or one with a per-sample transform."""
    if getattr(dataset, "transform", None) is not None:
        return None
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return dataset.tensors
    if callable(getattr(dataset, "tensors", None)):
        return dataset.tensors()
    return None


class _LimitedTensors(Dataset):
    """The first n samples of an in-memory dataset, keeping what it says about itself."""

    def __init__(self, dataset, n: int):
        self.source, self.n = dataset, n

    def tensors(self):
        x, y = self.source.tensors()
        return x[:self.n], y[:self.n]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if index >= self.n:
            raise IndexError(index)
        return self.source[index]

    def __getattr__(self, name: str):  # num_classes, in_shape, normalization, classes, ...
        if name in ("source", "n"):
            raise AttributeError(name)
        return getattr(self.source, name)


def _limited(dataset: Dataset, n: int) -> Dataset:
    if isinstance(dataset, TensorDataset):
        return TensorDataset(*(t[:n] for t in dataset.tensors))
    if callable(getattr(dataset, "tensors", None)):
        return _LimitedTensors(dataset, n)
    return Subset(dataset, range(n))


def _labels(dataset: Dataset) -> torch.Tensor | None:
    """All labels when the dataset has them at hand (tensors, or a `targets` list as torchvision's have)."""
    tensors = tensors_of(dataset)
    if tensors is not None:
        return tensors[1]
    targets = getattr(dataset, "targets", None)
    if isinstance(dataset, Subset) and targets is None:
        base = getattr(dataset.dataset, "targets", None)
        targets = [base[i] for i in dataset.indices] if base is not None else None
    return torch.as_tensor(targets) if targets is not None else None


def _sampled_labels(dataset: Dataset, which: str) -> torch.Tensor:
    """Labels of up to _LABEL_SAMPLES samples spread over a dataset that keeps no label list (each read costs a
    __getitem__, so a large one is checked on a sample, not whole)."""
    count = min(len(dataset), _LABEL_SAMPLES)
    indices = torch.linspace(0, len(dataset) - 1, count).long().unique().tolist()
    return torch.as_tensor([int(_sample(dataset, i, which)[1]) for i in indices])


@dataclass
class Data:
    train: Dataset
    test: Dataset
    in_shape: tuple[int, ...]
    num_classes: int
    normalization: Any  # framework.data.builtin.Normalization, or None: inputs are used as they come


def _sample(dataset: Dataset, index: int, which: str):
    try:
        item = dataset[index]
    except Exception as exc:
        raise ConfigError(f"dataset.{which}[{index}] could not be read: {type(exc).__name__}: {exc}") from None
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise ConfigError(f"dataset.{which}[{index}] is a {type(item).__name__}, not an (input, label) pair")
    x = item[0]
    if not torch.is_tensor(x):
        raise ConfigError(f"dataset.{which}[{index}] gives an input of type {type(x).__name__}, not a tensor; add a "
                          "transform that makes one (e.g. torchvision.transforms.ToTensor)")
    return x, item[1]


def _in_shape(cfg: DatasetConfig, data: dict[str, Dataset], check: bool) -> tuple[int, ...]:
    declared = cfg.in_shape
    said = getattr(data["train"], "in_shape", None)  # a dataset that states its shape (the built-ins) is trusted
    if said or (declared and not check):
        return tuple(said or declared)
    shapes = {}
    for which, dataset in data.items():
        for index in range(min(_SHAPE_SAMPLES, len(dataset))):
            shapes.setdefault(tuple(_sample(dataset, index, which)[0].shape), f"dataset.{which}[{index}]")
    if len(shapes) > 1:
        found = ", ".join(f"{where}: {list(shape)}" for shape, where in shapes.items())
        raise ConfigError(f"dataset samples differ in shape ({found}); every input must have one shape (resize or "
                          "crop them with a transform)")
    [shape] = shapes
    if declared and tuple(declared) != shape:
        raise ConfigError(f"dataset.in_shape={list(declared)} is not allowed: the samples have shape {list(shape)}")
    return shape


def _num_classes(cfg: DatasetConfig, data: dict[str, Dataset], check: bool) -> int:
    declared = cfg.num_classes
    train = data["train"]
    said = getattr(train, "num_classes", None)  # trusted, like in_shape: no labels are read for it
    found = declared or said or len(getattr(train, "classes", None) or []) or None
    labels = {}
    if (check or not found) and not said:
        labels = {which: _labels(dataset) for which, dataset in data.items()}
        labels = {which: y if y is not None else _sampled_labels(data[which], which) for which, y in labels.items()}
    if found is None:
        found = int(max(int(y.max()) for y in labels.values())) + 1
    if not isinstance(found, int) or found < 2:
        raise ConfigError(f"dataset.num_classes={found!r} is not allowed: expected an integer >= 2")
    for which, y in labels.items():
        if y is not None and len(y) and (int(y.min()) < 0 or int(y.max()) >= found):
            bad = int(y.min()) if int(y.min()) < 0 else int(y.max())
            raise ConfigError(f"dataset.{which} has label {bad}, outside [0, {found}) for num_classes={found}; "
                              "labels must be class ids 0..num_classes-1 (set dataset.num_classes if it is larger)")
    return found


def build_data(cfg: DatasetConfig, check: bool = False) -> Data:
    """Both splits and their facts. check=True (the driver, once): also compare sample shapes and label ranges."""
    data = {which: build_split(cfg, which) for which in SPLITS}
    in_shape = _in_shape(cfg, data, check)
    num_classes = _num_classes(cfg, data, check)
    return Data(data["train"], data["test"], in_shape, num_classes, getattr(data["train"], "normalization", None))
