"""The batch as fake tensors (torch's FakeTensorMode: the sizes, dtypes and devices of real ones, without their
memory). The model is built fake from the start (framework/assemble.py: build_task's model_made_in)."""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map_only


def fake_batch(batch, mode: FakeTensorMode):
    return tree_map_only(torch.Tensor, mode.from_tensor, batch)
