"""Opt-in speed-ups of the bare model: `trainer.channels_last` (NHWC memory layout) and `trainer.compile`
(torch.compile). Applied before a strategy wraps the model, so DDP and DataParallel see the final module.

channels_last only changes how 4-D tensors are laid out; the batches must be channels_last too
(`Normalizer(..., channels_last=True)`), otherwise every convolution converts its input first.
"""
from __future__ import annotations

import torch
from torch import nn


def channels_last_applies(sample_shape) -> bool:
    """True for image samples (C, H, W): their batches are 4-D, the only rank channels_last describes."""
    return len(tuple(sample_shape)) == 3


def apply_speedups(model: nn.Module, cfg_trainer, device: torch.device, sample_shape=None) -> nn.Module:
    """Return the model with the speed-ups `cfg_trainer` asks for, on `device`. A missing key means off.
    `sample_shape` (one sample, without the batch dimension) lets flat-feature models skip channels_last."""
    layout = cfg_trainer.get("channels_last", False) and (sample_shape is None or channels_last_applies(sample_shape))
    model = model.to(device=device, memory_format=torch.channels_last) if layout else model.to(device)
    if cfg_trainer.get("compile", False):
        model = torch.compile(model)
    return model


def original_module(model: nn.Module) -> nn.Module:
    """The module under torch.compile's wrapper, whose state_dict keys have no '_orig_mod.' prefix:
    what to checkpoint so that runs with and without trainer.compile can resume each other."""
    return getattr(model, "_orig_mod", model)
