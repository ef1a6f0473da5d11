"""The optimizer from its typed options (conf/optimizer/*.yaml: `_target_` + `_partial_`, any torch optimizer;
framework/config/optimizer.py), with optional linear lr scaling; what its constructor refuses is one line naming the
optimizer.* keys (the driver builds it once, on the model's parameters, before any worker starts).

lr_scaling=linear multiplies the configured lr by the number of workers (processes or dp replicas): the rule of the
data-parallel tutorials for when the batch grows with the workers. Our trainer.batch_size is global, so keep
lr_scaling=none unless you also scale the batch with the workers.

optimizer.param_groups give parts of the model other settings (framework/training/param_groups.py): the optimizer is
built on the groups the plan makes of the engine's parameters, each group's lr the (scaled) lr x its lr_scale.
"""
from __future__ import annotations

from hydra.errors import InstantiationException

from framework.config.optimizer import OptimizerConfig
from framework.common.errors import ConfigError, on_one_line
from framework.config.targets import instantiate
from framework.training.param_groups import ParamGroups


def build_optimizer(options: OptimizerConfig, params, workers: int, groups: ParamGroups | None = None,
                    names: list[str] | None = None):
    """The optimizer on `params` (the engine's parameters); with `groups` (the plan of optimizer.param_groups on the
    plain model) on its param groups, each parameter's group by its name in `names` where the engine gives them."""
    arguments = options.constructor_arguments(workers)
    try:
        make = instantiate(arguments, "optimizer")
    except InstantiationException as exc:
        cause = exc.__cause__ or exc
        what = "imported" if isinstance(cause, ImportError) else "built"
        raise ConfigError(f"optimizer._target_={options._target_} is not allowed: it cannot be {what} "
                          f"({on_one_line(cause) or type(cause).__name__})") from None
    if groups is not None:
        params = groups.split(params, arguments["lr"], names)
    try:
        optimizer = make(params)
    except Exception as exc:  # the constructor's own refusal, whatever its type
        given = ", ".join(f"optimizer.{name}={_text(value)}" for name, value in arguments.items()
                          if not name.startswith("_"))
        raise ConfigError(f"optimizer._target_={options._target_} refused its arguments ({given}): "
                          f"{type(exc).__name__}: {on_one_line(exc) or type(exc).__name__}") from None
    if groups is not None:
        groups.check_settings(optimizer, options._target_)
    return optimizer


def _text(value) -> str:
    """A value as an override writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
