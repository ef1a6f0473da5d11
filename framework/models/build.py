"""Instantiate conf/model/*.yaml. A model from any library works by `_target_`: the dataset's input shape and class
count are passed only to a constructor (or factory) that names `in_shape` / `num_classes` among its parameters and
whose config does not set them already, and only when the dataset knows them (else the parameter's default stands;
one without a default is refused). A torchvision factory such as `torchvision.models.resnet50` takes
`num_classes` through **kwargs: give it in the model's config, e.g. `num_classes: ${dataset.num_classes}`."""
from __future__ import annotations

import inspect

from torch import nn

from framework.config.components import build_component, parameters_of
from framework.common.errors import ConfigError


def model_facts(model_cfg: dict, in_shape: tuple[int, ...] | None, num_classes: int | None) -> dict:
    """The keyword arguments the dataset adds for this model: in_shape and num_classes where its constructor names
    them and its config does not set them; a fact the dataset does not know is left to the parameter's default."""
    parameters = parameters_of(str(model_cfg.get("_target_") or ""), "model")
    known = {"in_shape": tuple(in_shape) if in_shape is not None else None, "num_classes": num_classes}
    facts = {}
    for name, value in known.items():
        if name not in parameters or name in model_cfg:
            continue
        if value is not None:
            facts[name] = value
        elif parameters[name].default is inspect.Parameter.empty:
            raise ConfigError(_UNKNOWN[name].format(target=model_cfg["_target_"]))
    return facts


_UNKNOWN = {
    "in_shape": "model={target} takes in_shape, and the dataset's input is not one tensor; set dataset.in_shape, "
                "or give the model what it needs in its config",
    "num_classes": "model={target} takes num_classes, and the dataset has no class ids to count them; set "
                   "dataset.num_classes (or the model's own num_classes)",
}


def build_model(model_cfg: dict, in_shape: tuple[int, ...] | None, num_classes: int | None) -> nn.Module:
    model = build_component(model_cfg, "model", **model_facts(model_cfg, in_shape, num_classes))
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model._target_={model_cfg['_target_']} is not allowed: it built a {type(model).__name__}, "
                          "not a torch.nn.Module")
    return model
