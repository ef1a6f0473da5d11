"""Size helpers so models adapt to the dataset instead of hand-edited numbers."""
from __future__ import annotations

import torch
from torch import nn

from framework.common.errors import ConfigError


def flat_features(features: nn.Module, in_shape: tuple[int, ...], model_name: str) -> int:
    """Number of features `features` produces for one input of in_shape (found by a dry run)."""
    try:
        with torch.no_grad():
            return int(features(torch.zeros(1, *in_shape)).numel())
    except RuntimeError as exc:
        raise ConfigError(f"model={model_name} cannot take the dataset's input shape {tuple(in_shape)}: {exc}") from exc


def image_shape(in_shape: tuple[int, ...], model_name: str) -> tuple[int, int, int]:
    if len(in_shape) != 3:
        raise ConfigError(
            f"model={model_name} needs image input (channels, height, width); the dataset gives shape "
            f"{tuple(in_shape)}. Use model=linear for flat features."
        )
    return tuple(in_shape)
