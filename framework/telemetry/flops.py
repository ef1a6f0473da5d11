"""Training FLOPs per sample, counted once at start with torch.utils.flop_counter (forward + backward of one
micro-batch). It runs on the meta device: shapes only, so no memory, no time on the GPU, and the real model's
weights, gradients and BatchNorm running statistics are never touched. Whatever the model's forward prints or warns
while it is counted is dropped: that forward is ours, not a training step the user should see."""
from __future__ import annotations

import contextlib
import io
import warnings

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

from framework.data.batches import leaves, tree_map


def _on_meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t, device="meta").requires_grad_(t.requires_grad)


def training_flops_per_sample(model: nn.Module, example, batch: int) -> float:
    """FLOPs of forward + backward for one sample (matmuls and convolutions, as FlopCounterMode counts them).
    `example`: one sample's input shape (a float input), or a batch of the real input (any nesting of tensors, any
    dtypes), whose shapes and dtypes a micro-batch of `batch` samples is made of. The model is the user's plain
    module (no strategy wrapper); raises if its forward cannot run on meta tensors."""
    state = {name: _on_meta(t) for name, t in [*model.named_parameters(), *model.named_buffers()]}
    if isinstance(example, tuple) and all(isinstance(d, int) for d in example):
        x = torch.empty((batch, *example), device="meta")
    else:
        x = tree_map(lambda t: torch.empty((batch, *t.shape[1:]), dtype=t.dtype, device="meta"), example)
    with silenced(), FlopCounterMode(display=False) as counter:
        out = functional_call(model, state, (x,))
        sum(t.float().sum() for t in leaves(out) if t.is_floating_point()).backward()
    return counter.get_total_flops() / batch


@contextlib.contextmanager
def silenced():
    """Whatever runs inside prints and warns nothing the user sees (a model's own prints in a forward that is ours,
    not a training step)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
