"""Batches of any structure: a sample's input and target may each be a tensor or any nesting of tuples, lists and
dicts of tensors (what torch's default_collate builds from such samples). Everything here walks that nesting; the
rest of the framework never assumes images or class ids (a tensor's first dimension is the batch).

torch has these walks only in a private module (torch.utils._pytree), so they are written out here."""
from __future__ import annotations

from typing import Any, Callable

import torch


def tree_map(fn: Callable[[torch.Tensor], Any], tree: Any) -> Any:
    """The same nesting with fn applied to every tensor (other leaves kept as they are)."""
    if torch.is_tensor(tree):
        return fn(tree)
    if isinstance(tree, dict):
        return type(tree)((k, tree_map(fn, v)) for k, v in tree.items())
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple
        return type(tree)(*(tree_map(fn, v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_map(fn, v) for v in tree)
    return tree


def leaves(tree: Any) -> list[torch.Tensor]:
    """Every tensor in the nesting, in order."""
    found: list[torch.Tensor] = []
    tree_map(found.append, tree)
    return found


def batch_size(*trees: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    for tree in trees:
        tensors = leaves(tree)
        if tensors:
            return tensors[0].shape[0] if tensors[0].dim() else 1
    raise ValueError("a batch without a tensor has no size")


def to_device(tree: Any, device: torch.device) -> Any:
    """Every tensor on `device`; copies to a GPU do not block (from pinned memory they overlap with compute)."""
    non_blocking = device.type == "cuda"
    return tree_map(lambda t: t.to(device, non_blocking=non_blocking), tree)


def take(tree: Any, index: torch.Tensor) -> Any:
    """The samples at `index` of every tensor (their first dimension)."""
    return tree_map(lambda t: t[index], tree)


def float_outputs(tree: Any) -> Any:
    """Floating-point outputs in fp32 (what losses and metrics compute in, whatever autocast computed them in)."""
    return tree_map(lambda t: t.float() if t.is_floating_point() else t, tree)


def describe(tree: Any, name: str = "x") -> str:
    """The shapes and dtypes of a nesting, for messages: `x: float32 [2, 1, 28, 28]`, `x['ids']: int64 [2, 16]`."""
    parts: list[str] = []

    def walk(node, path):
        if torch.is_tensor(node):
            parts.append(f"{path}: {str(node.dtype).removeprefix('torch.')} {list(node.shape)}")
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}[{k!r}]")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        else:
            parts.append(f"{path}: {type(node).__name__}")

    walk(tree, name)
    return ", ".join(parts)
