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


def apply_speedups(model: nn.Module, cfg_trainer, device: torch.device, sample_shape=None,
                   strategy_ok: bool = True, move: bool = True) -> nn.Module:
    """Return the model with the speed-ups `cfg_trainer` asks for, on `device` (move=False: where it is, for a
    strategy that places it itself). A missing key means off; the worker passes its already resolved
    channels_last (a bool) so batches and model agree."""
    layout = use_channels_last(cfg_trainer.get("channels_last", False), model, device, sample_shape, strategy_ok)
    if layout:
        model = model.to(device=device if move else None, memory_format=torch.channels_last)
    elif move:
        model = model.to(device)
    if cfg_trainer.get("compile", False):
        model = torch.compile(model)
    return model


def original_module(model: nn.Module) -> nn.Module:
    """The module under torch.compile's wrapper, whose state_dict keys have no '_orig_mod.' prefix:
    what to checkpoint so that runs with and without trainer.compile can resume each other."""
    return getattr(model, "_orig_mod", model)
