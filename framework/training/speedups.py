"""Speed-ups of the bare model: `trainer.channels_last` (NHWC memory layout) and `trainer.compile`
(torch.compile). Applied before a strategy wraps the model, so DDP and DataParallel see the final module.

channels_last only changes how 4-D tensors are laid out; the batches must be channels_last too
(`Normalizer(..., channels_last=True)`), otherwise every convolution converts its input first.
`trainer.channels_last=auto` (the default) turns it on where it was measured to pay: on the CPU, for models
whose class says `channels_last_helps = True` (LeNet: 1.25-1.38x steps/s in bench/speedups.py).
"""
from __future__ import annotations

import torch
from torch import nn


def channels_last_applies(sample_shape) -> bool:
    """True for image samples (C, H, W): their batches are 4-D, the only rank channels_last describes."""
    return len(tuple(sample_shape)) == 3


def use_channels_last(setting, model: nn.Module, device: torch.device, sample_shape=None,
                      strategy_ok: bool = True) -> bool:
    """Resolve trainer.channels_last (true | false | auto) for this model, device, sample shape and strategy.
    `sample_shape` (one sample, without the batch dimension) lets flat-feature models skip channels_last;
    `strategy_ok` is False for engines that flatten parameters (validation refuses an explicit true there)."""
    if not strategy_ok or (sample_shape is not None and not channels_last_applies(sample_shape)):
        return False
    if setting == "auto":
        return device.type == "cpu" and getattr(model, "channels_last_helps", False)
    return bool(setting)


def apply_speedups(model: nn.Module, channels_last: bool, compile: bool, device: torch.device,
                   move: bool = True) -> nn.Module:
    """The model in channels_last layout (resolved already: batches and model must agree) and torch.compile'd
    when asked, on `device` (move=False: where it is, for a strategy that places it itself)."""
    if channels_last:
        model = model.to(device=device if move else None, memory_format=torch.channels_last)
    elif move:
        model = model.to(device)
    if compile:
        model = torch.compile(model)
    return model


def original_module(model: nn.Module) -> nn.Module:
    """The module under torch.compile's wrapper, whose state_dict keys have no '_orig_mod.' prefix:
    what to checkpoint so that runs with and without trainer.compile can resume each other."""
    return getattr(model, "_orig_mod", model)
