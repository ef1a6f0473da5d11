"""Instantiate conf/model/*.yaml. A model from any library works by `_target_`: the dataset's input shape and class
count are passed only to a constructor (or factory) that names `in_shape` / `num_classes` among its parameters and
whose config does not set them already (a torchvision factory such as `torchvision.models.resnet50` takes
`num_classes` through **kwargs: give it in the model's config, e.g. `num_classes: ${dataset.num_classes}`)."""
from __future__ import annotations

import inspect

from hydra.utils import get_object
from torch import nn

from framework.config.components import build_component
from framework.errors import ConfigError


def _named_parameters(target: str) -> set[str]:
    try:
        return set(inspect.signature(get_object(target)).parameters)
    except Exception:  # not importable, or no signature: build_component says what is wrong
        return set()


def model_facts(model_cfg: dict, in_shape: tuple[int, ...] | None, num_classes: int | None) -> dict:
    """The keyword arguments the dataset adds for this model: in_shape and num_classes where it names them."""
    wanted = _named_parameters(str(model_cfg.get("_target_", ""))) - set(model_cfg)
    facts = {}
    if "in_shape" in wanted:
        if in_shape is None:
            raise ConfigError(f"model={model_cfg['_target_']} takes in_shape, and the dataset's input is not one "
                              "tensor; set dataset.in_shape, or give the model what it needs in its config")
        facts["in_shape"] = tuple(in_shape)
    if "num_classes" in wanted:
        if num_classes is None:
            raise ConfigError(f"model={model_cfg['_target_']} takes num_classes, and the dataset has no class ids to "
                              "count them; set dataset.num_classes (or the model's own num_classes)")
        facts["num_classes"] = num_classes
    return facts


def build_model(model_cfg: dict, in_shape: tuple[int, ...] | None, num_classes: int | None) -> nn.Module:
    model = build_component(model_cfg, "model", **model_facts(model_cfg, in_shape, num_classes))
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model._target_={model_cfg['_target_']} is not allowed: it built a {type(model).__name__}, "
                          "not a torch.nn.Module")
    return model
