"""Instantiate conf/model/*.yaml for a dataset's input shape and class count."""
from __future__ import annotations

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from torch import nn

from framework.errors import ConfigError


def build_model(model_cfg: dict, in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    try:
        return instantiate(model_cfg, in_shape=tuple(in_shape), num_classes=num_classes)
    except InstantiationException as exc:
        if isinstance(exc.__cause__, ConfigError):
            raise exc.__cause__ from None
        raise


def check_model_fits(model_cfg: dict, in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Driver-side: build the model once (with its one-sample dry run) so a mismatch fails before any
    worker starts. On the CPU, not the meta device: `with torch.device("meta")` imports torch._dynamo,
    1.3 s of start-up that every ddp worker would wait for; LeNet builds in 10 ms. Returns the model."""
    return build_model(model_cfg, in_shape, num_classes)
