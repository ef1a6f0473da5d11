"""A built model's tensors as fake tensors (torch's FakeTensorMode: the sizes, dtypes and devices of real ones,
without their memory), so that the strategy's parallelize and two training steps run on them."""
from __future__ import annotations

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map_only


def fake_model(model: nn.Module, mode: FakeTensorMode) -> None:
    """Every parameter and buffer of `model` replaced, in place, by a fake one (a parameter tied to two modules
    stays one parameter). Not through Module._apply: torch swaps fake parameters there, which it then refuses."""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in made:
                made[id(param)] = nn.Parameter(mode.from_tensor(param.detach()), requires_grad=param.requires_grad)
            setattr(module, name, made[id(param)])
        for name, buffer in list(module.named_buffers(recurse=False)):
            setattr(module, name, mode.from_tensor(buffer))


def fake_batch(batch, mode: FakeTensorMode):
    return tree_map_only(torch.Tensor, mode.from_tensor, batch)
