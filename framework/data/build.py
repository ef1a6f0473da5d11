"""The dataset's typed options (framework/config/dataset.py) -> the train and test Datasets, and the facts a model
may need (the input shape, the class count).

A dataset config names two components, `train` and `test`, or one (its own `_target_`) split by `val_fraction` or,
when its constructor takes `train` (torchvision's convention), built with train=True and train=False; each any
map-style torch Dataset, built with Hydra's instantiate (so `_target_` may be a class or a factory, `_partial_` too,
and nested `_target_`s such as a torchvision transform pipeline are built first). A sample is an (input, target)
pair, or an input only (autoencoders, self-supervised steps: the step gets the batch as it is); input and target may
be tensors or any nesting of them (framework/data/batches.py), or anything the user's collate_fn makes a batch of
(framework/data/collate.py). The built-in datasets are ordinary entries of the same mechanism."""
from __future__ import annotations

import itertools
import math
import weakref

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from framework.config.components import build_component, parameters_of
from framework.data.batches import describe, take
from framework.data.collate import KEY as COLLATE_KEY, Collate, split_collates
from framework.data.streams import LimitedStream, is_stream
from framework.config.dataset import DatasetConfig
from framework.common.errors import ConfigError

SPLITS = ("train", "test")
_SHAPE_SAMPLES = 8  # samples whose shapes are compared in the driver (all of them would read the whole dataset)
_LABEL_SAMPLES = 1024  # labels read in the driver from a dataset that has no `targets`


def _as_dataset(node: dict, key: str) -> Dataset:
    target = node["_target_"]
    dataset = build_component(node, key)
    if callable(dataset) and not hasattr(dataset, "__getitem__") and not is_stream(dataset):  # `_partial_: true`
        dataset = dataset()
    dataset = torch_formatted(dataset)
    if is_stream(dataset):
        if not _head(dataset, 1):
            raise ConfigError(f"{key}._target_={target} is not allowed: the stream ({type(dataset).__name__}) yielded "
                              "no sample; a streaming dataset (an IterableDataset) must yield at least one sample "
                              "each time it is iterated")
        return dataset
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise ConfigError(f"{key}._target_={target} is not allowed: it returned a {type(dataset).__name__}, which is "
                          "neither a map-style torch Dataset (__len__ and __getitem__ giving (input, target)) nor an "
                          "IterableDataset (__iter__ yielding them)")
    if len(dataset) == 0:
        raise ConfigError(f"{key}._target_={target} is not allowed: the dataset is empty")
    return dataset


def torch_formatted(dataset):
    """A HuggingFace `datasets` dataset with no format yet gives torch tensors (with_format("torch")); any other
    dataset as it is."""
    if type(dataset).__module__.startswith("datasets.") and callable(getattr(dataset, "with_format", None)):
        if getattr(dataset, "format", {}).get("type") is None and getattr(dataset, "_formatting", None) is None:
            return dataset.with_format("torch")
    return dataset


def build_collates(cfg: DatasetConfig) -> dict[str, Collate]:
    """Each split's collate_fn: its own (dataset.<split>.collate_fn), else dataset.collate_fn, else torch's."""
    nodes = {which: getattr(cfg, which) for which in SPLITS}
    return split_collates(cfg.collate_fn, {which: node.get(COLLATE_KEY) if isinstance(node, dict) else None
                                           for which, node in nodes.items()})


def build_splits(cfg: DatasetConfig) -> dict[str, Dataset]:
    """The train and test splits: dataset.train and dataset.test, or one dataset (the node's own _target_) split by
    dataset.val_fraction or built with train=True/False; each limited to dataset.max_<split>_samples."""
    one = cfg.one_dataset
    if one is not None and cfg.val_fraction is not None:
        splits = split_one(_as_dataset(one, "dataset"), cfg.val_fraction, cfg.split_seed)
    elif one is not None:
        if "train" not in parameters_of(one["_target_"]):
            raise ConfigError(f"dataset._target_={one['_target_']} needs dataset.val_fraction (the share of its "
                              "samples held out for testing, e.g. 0.1), or a constructor taking `train` (built with "
                              "train=True and train=False for the two splits)")
        splits = {which: _as_dataset({**one, "train": which == "train"}, "dataset") for which in SPLITS}
    else:
        splits = {}
        for which in SPLITS:
            node = getattr(cfg, which)
            if not isinstance(node, dict) or "_target_" not in node:
                raise ConfigError(
                    f"dataset.{which} is missing or has no _target_: a dataset config names either `train:` and "
                    "`test:` Datasets with _target_, or one Dataset with _target_ (and val_fraction, unless it "
                    "takes `train`) (see docs/your-own-code.md)")
            splits[which] = _as_dataset({k: v for k, v in node.items() if k != COLLATE_KEY}, f"dataset.{which}")
    for which, dataset in splits.items():
        if is_stream(dataset):
            splits[which] = _limited_stream(cfg, which, dataset)
            continue
        limit = getattr(cfg, f"max_{which}_samples") or len(dataset)
        share = getattr(cfg, f"{which}_share")
        if share is not None:
            limit = min(limit, math.ceil(share * len(dataset)))
        if limit < len(dataset):
            splits[which] = subset(dataset, torch.arange(limit))
    return splits


def _limited_stream(cfg: DatasetConfig, which: str, dataset):
    """A stream cut to dataset.max_<split>_samples; a share of it has no meaning (its length is unknown)."""
    share = getattr(cfg, f"{which}_share")
    if share is not None:
        raise ConfigError(f"dataset.{which}_share={share} is not allowed: dataset.{which} is a stream (an "
                          f"IterableDataset), whose length is unknown; use dataset.max_{which}_samples")
    limit = getattr(cfg, f"max_{which}_samples")
    return LimitedStream(dataset, limit) if limit else dataset


def split_one(dataset: Dataset, val_fraction: float, seed: int) -> dict[str, Dataset]:
    """A seeded permutation cut into test (the first val_fraction) and train: the same on every rank, world size
    and resume (it depends on the seed and the dataset's length only)."""
    if is_stream(dataset):
        raise ConfigError(f"dataset.val_fraction={val_fraction} is not allowed: dataset._target_ is a stream (an "
                          "IterableDataset), which cannot be split by index; name dataset.train and dataset.test")
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    held_out = max(1, round(val_fraction * len(dataset)))
    if held_out >= len(dataset):
        raise ConfigError(f"dataset.val_fraction={val_fraction} is not allowed: it leaves no training sample of the "
                          f"{len(dataset)}")
    return {"train": subset(dataset, order[held_out:]), "test": subset(dataset, order[:held_out])}


def tensors_of(dataset: Dataset) -> tuple[Any, Any] | None:
    """(inputs, targets) of the whole split when the dataset can give them as tensors (each a tensor or a nesting of
    them, first dimension the sample): a TensorDataset of two, or a dataset with `tensors()` (the built-ins); None for
    anything else, or one with a per-sample transform."""
    if is_stream(dataset) or getattr(dataset, "transform", None) is not None:
        return None
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return dataset.tensors
    if callable(getattr(dataset, "tensors", None)):
        return dataset.tensors()
    return None


class _IndexedTensors(Dataset):
    """Some samples of an in-memory dataset, keeping what it says about itself (in_shape, normalization, ...)."""

    def __init__(self, dataset, indices: torch.Tensor):
        self.source, self.indices = dataset, indices

    def tensors(self):
        x, y = self.source.tensors()
        return take(x, self.indices), take(y, self.indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int):
        return self.source[int(self.indices[index])]

    def __getattr__(self, name: str):  # num_classes, in_shape, normalization, classes, ...
        if name in ("source", "indices"):
            raise AttributeError(name)
        return getattr(self.source, name)


def subset(dataset: Dataset, indices: torch.Tensor) -> Dataset:
    """The samples at `indices`, keeping the in-memory fast path where the dataset had it."""
    if isinstance(dataset, TensorDataset):
        return TensorDataset(*(t[indices] for t in dataset.tensors))
    if callable(getattr(dataset, "tensors", None)):
        return _IndexedTensors(dataset, indices)
    return Subset(dataset, indices.tolist())


@dataclass(kw_only=True)
class Data:
    train: Dataset
    test: Dataset
    in_shape: tuple[int, ...] | None  # one sample's input shape; None where the input is not one tensor
    num_classes: int | None  # the class count where there are class ids (or the dataset says it); else None
    normalization: Any  # framework.data.builtin.Normalization, or None: inputs are used as they come
    example: Any  # the first training sample as a batch of one (its split's collate), on the CPU
    collate: dict[str, Collate]  # each split's collate_fn (framework/data/collate.py)
    not_pairs: str | None = None  # why batches are not (inputs, targets): the step gets each batch as it is

    @property
    def pairs(self) -> bool:
        """Whether a batch is (inputs, targets); else it is inputs only."""
        return self.not_pairs is None

    def inputs(self, batch):
        """A batch's inputs: its first part when batches are (inputs, targets), else the whole batch."""
        return batch[0] if self.pairs else batch


def is_pair(item) -> bool:
    """A sample (or batch) that is (input, target): a tuple or list of two; anything else is an input only."""
    return isinstance(item, (tuple, list)) and len(item) == 2


_first_of_stream: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # a stream's first samples, read once


def _count(dataset: Dataset, most: int) -> int:
    """How many of the first `most` samples the split has."""
    return len(_head(dataset, most)) if is_stream(dataset) else min(most, len(dataset))


def _head(dataset, count: int) -> list:
    """A stream's first `count` samples (fewer where it has fewer), read once per process and kept."""
    kept, whole = _first_of_stream.get(dataset, ([], False))
    if len(kept) < count and not whole:
        kept = list(itertools.islice(iter(dataset), count))
        _first_of_stream[dataset] = kept, len(kept) < count
    return kept[:count]


def first_samples(dataset: Dataset, count: int) -> list:
    """A split's first `count` samples (fewer where it has fewer)."""
    return _head(dataset, count) if is_stream(dataset) else [dataset[i] for i in range(min(count, len(dataset)))]


def _read(dataset: Dataset, index: int, which: str):
    try:
        if is_stream(dataset):
            return _head(dataset, index + 1)[index]
        return dataset[index]
    except Exception as exc:
        raise ConfigError(f"dataset.{which}[{index}] could not be read: {type(exc).__name__}: {exc}") from None


def _input(dataset: Dataset, index: int, which: str):
    """A sample's input (the whole sample when it has no target), checked to be what torch's collate can stack."""
    item = _read(dataset, index, which)
    x = item[0] if is_pair(item) else item
    bad = _not_tensors(x)
    if bad is not None:
        raise ConfigError(f"dataset.{which}[{index}] gives an input of type {type(bad).__name__}, not a tensor; add a "
                          "transform that makes one (e.g. torchvision.transforms.ToTensor), or a dataset.collate_fn")
    return x


def _target(dataset: Dataset, index: int, which: str):
    item = _read(dataset, index, which)
    return item[1] if is_pair(item) else None


def _a(kind: str) -> str:
    return f"{'an' if kind[0].lower() in 'aeiou' else 'a'} {kind}"


def _not_tensors(tree):
    """The first leaf of an input that torch's collate cannot make a tensor of, or None."""
    if torch.is_tensor(tree) or isinstance(tree, (int, float, np.ndarray, np.number)):
        return None
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return next((b for b in map(_not_tensors, tree) if b is not None), None)
    return tree


def _shapes(tree) -> Any:
    """The shapes of a nesting's leaves (a number's is ())."""
    if isinstance(tree, dict):
        return {k: _shapes(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_shapes(v) for v in tree]
    return tuple(np.shape(tree))


def _in_shape(cfg: DatasetConfig, splits: dict[str, Dataset], check: bool, collated: bool) -> tuple[int, ...] | None:
    """Declared, said by the dataset, or the samples' one shape; with a collate_fn of the user's (collated) samples
    may differ in shape and only a declared or said shape is known."""
    declared = cfg.in_shape
    said = getattr(splits["train"], "in_shape", None)  # a dataset that states its shape (the built-ins) is trusted
    if said or (declared and (not check or collated)):
        return tuple(said or declared)
    if collated:
        return None
    shapes = {}
    for which, dataset in splits.items():
        for index in range(_count(dataset, _SHAPE_SAMPLES if check else 1)):
            shapes.setdefault(repr(_shapes(_input(dataset, index, which))), f"dataset.{which}[{index}]")
    if len(shapes) > 1:
        found = ", ".join(f"{where}: {shape.replace('(', '[').replace(')', ']').replace(',]', ']')}"
                          for shape, where in shapes.items())
        raise ConfigError(f"dataset samples differ in shape ({found}); every input must have one shape (resize or "
                          "crop them with a transform), or name a dataset.collate_fn that makes batches of them")
    x = _input(splits["train"], 0, "train")
    shape = tuple(x.shape) if torch.is_tensor(x) else None
    if declared and tuple(declared) != shape:
        raise ConfigError(f"dataset.in_shape={list(declared)} is not allowed: the samples have shape "
                          f"{list(shape) if shape else describe(x, 'input')}")
    return shape


def _labels(dataset: Dataset) -> torch.Tensor | None:
    """All class ids when the dataset has them at hand (tensors, or a `targets` list as torchvision's have)."""
    if is_stream(dataset):
        return None
    tensors = tensors_of(dataset)
    if tensors is not None:
        return tensors[1] if torch.is_tensor(tensors[1]) else None
    targets = getattr(dataset, "targets", None)
    if isinstance(dataset, Subset) and targets is None:
        base = getattr(dataset.dataset, "targets", None)
        targets = [base[i] for i in dataset.indices] if base is not None else None
    if targets is None:
        return None
    try:
        return torch.as_tensor(targets)
    except (TypeError, ValueError, RuntimeError):  # targets of different lengths: read them sample by sample
        return None


def _sampled_labels(dataset: Dataset, which: str) -> torch.Tensor:
    """Class ids of up to _LABEL_SAMPLES samples spread over a dataset that keeps no label list (each read costs a
    __getitem__, so a large one is checked on a sample, not whole)."""
    if is_stream(dataset):  # the stream's first ones
        indices = list(range(_count(dataset, _LABEL_SAMPLES)))
    else:
        count = min(len(dataset), _LABEL_SAMPLES)
        indices = torch.linspace(0, len(dataset) - 1, count).long().unique().tolist()
    return torch.cat([torch.as_tensor(_target(dataset, i, which)).reshape(-1) for i in indices])  # any lengths


def is_class_ids(target) -> bool:
    """A target of class ids: an integer, or an integer tensor (one id per sample, or a mask of ids)."""
    if isinstance(target, (bool, np.bool_)):
        return False
    if isinstance(target, (int, np.integer)):
        return True
    return torch.is_tensor(target) and not target.is_floating_point() and not target.is_complex() \
        and target.dtype != torch.bool


def _num_classes(cfg: DatasetConfig, splits: dict[str, Dataset], check: bool, class_ids: ClassIds) -> int | None:
    """The class count: declared (dataset.num_classes), said by the dataset (num_classes, classes), or, where the
    loss or a metric takes class ids and the targets are ids, counted from them; with check (the driver) the ids are
    also checked to lie in [0, num_classes) (class_ids.ignore: a value the loss skips, e.g. a mask's border)."""
    train = splits["train"]
    said = getattr(train, "num_classes", None)  # trusted, like in_shape: no labels are read for it
    found = cfg.num_classes or said or len(getattr(train, "classes", None) or []) or None
    if not class_ids.expected or not is_class_ids(_target(train, 0, "train")):
        return found
    labels = {}
    if (check or not found) and not said:
        labels = {which: _labels(dataset) for which, dataset in splits.items()}
        labels = {which: y if y is not None else _sampled_labels(splits[which], which) for which, y in labels.items()}
        if class_ids.ignore is not None:
            labels = {which: y[y != class_ids.ignore] for which, y in labels.items()}
    if found is None:
        found = int(max(int(y.max()) for y in labels.values() if y.numel())) + 1
    if found < 2:
        raise ConfigError(f"dataset.num_classes={found!r} is not allowed: expected an integer >= 2")
    for which, y in labels.items():
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= found):
            bad = int(y.min()) if int(y.min()) < 0 else int(y.max())
            raise ConfigError(f"dataset.{which} has label {bad}, outside [0, {found}) for num_classes={found}; "
                              "labels must be class ids 0..num_classes-1 (set dataset.num_classes if it is larger)")
    return found


@dataclass
class ClassIds:
    """Whether the loss or a metric takes class ids (framework/training/metrics.py: class_ids_of), and the id the
    loss ignores (CrossEntropyLoss's ignore_index), if any."""

    expected: bool = False
    ignore: int | None = None


def build_data(cfg: DatasetConfig, class_ids: ClassIds = ClassIds(), check: bool = False,
               needs_targets: str | None = None) -> Data:
    """Both splits and their facts. check=True (the driver, once): also compare sample shapes and class ids, and
    collate the first samples of each split. needs_targets: the step that trains on (inputs, targets) only, which
    samples that are inputs only are refused for."""
    splits = build_splits(cfg)
    collate = build_collates(cfg)
    collated = any(c.own for c in collate.values())
    first = _read(splits["train"], 0, "train")
    example = collate["train"].first_batch([first], "train")
    not_pairs = None
    if not is_pair(example):
        not_pairs = (f"the batches of {collate['train'].where} are {_a(type(example).__name__)}, not (inputs, targets)"
                     if collated else f"dataset.train[0] is {_a(type(first).__name__)}, not an (input, target) pair")
        if needs_targets:
            raise ConfigError(f"{not_pairs}; step={needs_targets} needs (inputs, targets): for inputs only (an "
                              "autoencoder, a self-supervised objective) name a step of your own that takes the batch "
                              "as it is (step._target_=..., see docs/your-own-code.md, Data without targets)")
    in_shape = _in_shape(cfg, splits, check, collated)  # (samples of different shapes: one line, before collating)
    if check:
        for which, dataset in splits.items():
            batch = collate[which].first_batch([_read(dataset, i, which) for i in range(_count(dataset, 2))], which)
            if is_pair(batch) != is_pair(example):
                raise ConfigError(f"dataset.{which}'s batches are {'' if is_pair(batch) else 'not '}(inputs, targets) "
                                  f"and dataset.train's are {'' if is_pair(example) else 'not'}; both splits must give "
                                  "the same kind of sample")
    num_classes = _num_classes(cfg, splits, check, class_ids)
    if not collated:
        _input(splits["train"], 0, "train")
    return Data(train=splits["train"], test=splits["test"], in_shape=in_shape, num_classes=num_classes,
                normalization=getattr(splits["train"], "normalization", None), example=example, collate=collate,
                not_pairs=not_pairs)
