"""A sum of tensors in one fixed pairwise order: the order depends only on how many there are."""
from __future__ import annotations

import torch


def tree_sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    """((t0 + t1) + (t2 + t3)) + ... : neighbours added level by level, an odd last one carried up unchanged."""
    if not tensors:
        raise ValueError("tree_sum needs at least one tensor")
    level = list(tensors)
    while len(level) > 1:
        pairs = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        level = pairs + ([level[-1]] if len(level) % 2 else [])
    return level[0].clone() if level[0] is tensors[0] else level[0]
