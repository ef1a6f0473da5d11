"""Speed-ups of the bare model: `trainer.channels_last` (NHWC memory layout), `trainer.compile` (torch.compile)
and `trainer.activation_checkpointing` (memory for compute: each block's activations recomputed in backward).
Applied before a strategy wraps the model, so DDP, DataParallel and fully_shard see the final module; which modules
are compiled and which blocks recomputed is the strategy's choice (framework/strategies/base.py).

channels_last only changes how 4-D tensors are laid out; the batches must be channels_last too
(`Normalizer(..., channels_last=True)`), otherwise every convolution converts its input first.
`trainer.channels_last=auto` (the default) turns it on where it was measured to pay: on the CPU, for models
whose class says `channels_last_helps = True` (LeNet: 1.25-1.38x steps/s in bench/speedups.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


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


@dataclass
class SpeedupModules:
    """Which of a model's modules the speed-ups touch, as a strategy chooses them (Strategy.speedup_modules)."""

    recomputed: list[nn.Module]  # trainer.activation_checkpointing: blocks that run again in backward
    compiled: list[nn.Module]  # trainer.compile: compiled in place before parallelize() (none: the engine compiles)


def apply_speedups(model: nn.Module, channels_last: bool, device: torch.device, move: bool = True,
                   checkpointed: Sequence[nn.Module] = (), compiled: Sequence[nn.Module] = (),
                   backend: str = "inductor") -> nn.Module:
    """The model in channels_last layout (resolved already: batches and model must agree), on `device`
    (move=False: where it is, for a strategy that places it itself), with the `checkpointed` blocks recomputed in
    backward and the `compiled` modules (the model itself, or its blocks) torch.compile'd with `backend`. Both happen
    in place, so
    the parameter names stay the user's (no `_orig_mod.` or `_checkpoint_wrapped_module.` in any checkpoint), and
    before a strategy wraps the model (fsdp shards the checkpointed, compiled blocks, as torchtitan does)."""
    if channels_last:
        model = model.to(device=device if move else None, memory_format=torch.channels_last)
    elif move and not _already_on(model, device):
        model = model.to(device)
    for block in checkpointed:
        recompute_in_backward(block)
    for module in compiled:
        module.compile(backend=backend)
    return model


def _already_on(model: nn.Module, device: torch.device) -> bool:
    """Every parameter and buffer on `device`: nothing to move (and a model of fake tensors, the plan's
    (framework/plan/), cannot be moved: Module._apply swaps fake parameters, which torch refuses)."""
    return all(t.device == device for t in (*model.parameters(), *model.buffers()))


def recompute_in_backward(block: nn.Module) -> None:
    """Activation checkpointing of one block: its forward keeps only its inputs, and backward runs it again
    (torch.utils.checkpoint, non-reentrant). The block's own forward becomes the checkpointed one on this instance,
    not a wrapper module: torch's wrapper (checkpoint_wrapper) is private and renames every parameter.
    preserve_rng_state: the recomputation draws the same dropout masks, on the CPU and on the inputs' GPU.
    A function of ours calls checkpoint (not a functools.partial of it): torch.compile traces a compiled block from
    its first frame that is not torch's own, and checkpoint itself runs with the compiler off when called from one
    of torch's frames, so the block would stay uncompiled."""
    forward = block.forward

    def recomputed_forward(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)

    block.forward = recomputed_forward
