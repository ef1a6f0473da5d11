"""Bench-only: a language model whose blocks take a fixed time (sleeping, not computing) in forward and backward, so
that a pipeline's bubble can be measured without the stages competing for the CPU: with equal stages, its
theory, (p-1)/(m+p-1), holds exactly. It keeps the pipeline contract (docs/model-parallel.md). With this folder on
PYTHONPATH: model._target_=sleepy.SleepyLM model.forward_ms=20 model.backward_ms=40."""
from __future__ import annotations

import time

import torch
from torch import nn


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, forward_s: float, backward_s: float):
        time.sleep(forward_s)
        ctx.backward_s = backward_s
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.backward_s)
        return grad, None, None


class SleepyBlock(nn.Module):
    def __init__(self, hidden: int, forward_ms: float, backward_ms: float):
        super().__init__()
        self.mix = nn.Linear(hidden, hidden)
        self.forward_s, self.backward_s = forward_ms / 1000, backward_ms / 1000

    def forward(self, x):
        return _Sleep.apply(x + self.mix(x), self.forward_s, self.backward_s)


class SleepyLM(nn.Module):
    def __init__(self, num_classes, hidden: int = 16, layers: int = 8, forward_ms: float = 20, backward_ms: float = 40):
        super().__init__()
        self.embed = nn.Embedding(num_classes, hidden)
        self.blocks = nn.ModuleList(SleepyBlock(hidden, forward_ms, backward_ms) for _ in range(layers))
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, ids):
        x = self.embed(ids) if self.embed is not None else ids
        for block in self.blocks:
            if block is not None:
                x = block(x)
        return self.head(x) if self.head is not None else x
