"""The user's collate_fn: how a list of samples becomes a batch (padding token sequences, tags of -100 on the
padding, detection targets of varying length). `dataset.collate_fn` serves both splits; a split's own
`dataset.train.collate_fn` / `dataset.test.collate_fn` goes over it. Each is a component by `_target_`: a class whose
instances are called as collate_fn(samples), a factory returning the function, or the function itself with
`_partial_: true`. Without one, torch's default_collate stacks the samples (and in-memory splits keep their fast
path)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch.utils.data import default_collate

from framework.config.components import build_component
from framework.common.errors import ConfigError, first_line

KEY = "collate_fn"


@dataclass(frozen=True)
class Collate:
    """A split's collate function and where the config names it (for messages); `own` is False for torch's default."""

    fn: Callable
    where: str = "torch.utils.data.default_collate"
    own: bool = False

    def __call__(self, samples: list):
        return self.fn(samples)

    def first_batch(self, samples: list, which: str):
        """The batch of the first samples of a split, or one line saying that this collate_fn cannot make it."""
        try:
            return self.fn(samples)
        except Exception as exc:
            if not self.own:
                raise
            raise ConfigError(f"{self.where} failed on the first batch (dataset.{which}[0:{len(samples)}]): "
                              f"{type(exc).__name__}: {first_line(exc)}") from None


DEFAULT = Collate(default_collate)


def build_collate(node, key: str) -> Collate:
    """A collate_fn component (or None: torch's default), checked to be callable."""
    if node is None:
        return DEFAULT
    fn = build_component(node, key)
    where = f"{key}._target_={node['_target_']}" if isinstance(node, dict) and "_target_" in node else key
    if not callable(fn):
        raise ConfigError(f"{where} is not allowed: it built a {type(fn).__name__}, which cannot be called as "
                          "collate_fn(samples) (name a function with `_partial_: true`, or a class with __call__)")
    return Collate(fn, where, own=True)


def split_collates(shared, split_nodes: dict[str, dict | None]) -> dict[str, Collate]:
    """Each split's collate: its own `collate_fn` key (taken out of its node by the caller), else the shared one."""
    both = build_collate(shared, f"dataset.{KEY}")
    return {which: build_collate(own, f"dataset.{which}.{KEY}") if own is not None else both
            for which, own in split_nodes.items()}
