"""DistributedDataParallel's gradient buckets, laid beside a one-process trace: DDP cannot be built on fake tensors,
so ddp is planned as one process on its share of the batch plus what DDP adds, done as DDP does it. Its reducer
holds one flat bucket buffer per dtype of the trainable parameters (bucket_cap_mb splits it into collectives, not
into more bytes), alive from construction on. With gradient_as_bucket_view (the default) each gradient, once
accumulated, is copied into its place in the bucket and becomes a view of it, the accumulated tensor freed; without
it the gradients stay and the buckets are a copy beside them."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from framework.plan.tracer import BUFFERS, LiveBytes


@dataclass
class DDPBuckets:
    params: list[nn.Parameter]
    as_views: bool

    @classmethod
    def of(cls, options, model: nn.Module) -> "DDPBuckets":
        return cls([p for p in model.parameters() if p.requires_grad], bool(options.gradient_as_bucket_view))

    def attach(self, live: LiveBytes) -> None:
        """Made now (under the trace's fake mode), labelled as buffers; gradients moved into them as backward
        accumulates each one (before the trace's own hook sees it)."""
        for dtype in dict.fromkeys(p.dtype for p in self.params):
            mine = [p for p in self.params if p.dtype == dtype]
            flat = torch.zeros(sum(p.numel() for p in mine), dtype=dtype)
            live.label(flat, BUFFERS)
            views = flat.split([p.numel() for p in mine])
            for param, view in zip(mine, views):
                if self.as_views:
                    param.register_post_accumulate_grad_hook(_into(view.view_as(param)))

    @property
    def bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


def _into(view: torch.Tensor):
    def hook(param: nn.Parameter) -> None:
        if param.grad is not view:
            view.copy_(param.grad)
            param.grad = view
    return hook
