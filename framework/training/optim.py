"""The optimizer from its typed options (conf/optimizer/*.yaml: `_target_` + `_partial_`, any torch optimizer;
framework/config/optimizer.py), with optional linear lr scaling; what its constructor refuses is one line naming the
optimizer.* keys (the driver builds it once, on the model's parameters, before any worker starts).

lr_scaling=linear multiplies the configured lr by the number of workers (processes or dp replicas): the rule of the
data-parallel tutorials for when the batch grows with the workers. Our trainer.batch_size is global, so keep
lr_scaling=none unless you also scale the batch with the workers.
"""
from __future__ import annotations

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from framework.config.optimizer import OptimizerConfig
from framework.common.errors import ConfigError


def build_optimizer(options: OptimizerConfig, params, workers: int):
    arguments = options.constructor_arguments(workers)
    try:
        make = instantiate(arguments)
    except InstantiationException as exc:
        cause = exc.__cause__ or exc
        what = "imported" if isinstance(cause, ImportError) else "built"
        raise ConfigError(f"optimizer._target_={options._target_} is not allowed: it cannot be {what} "
                          f"({_one_line(cause)})") from None
    try:
        return make(params)
    except Exception as exc:  # the constructor's own refusal, whatever its type
        given = ", ".join(f"optimizer.{name}={_text(value)}" for name, value in arguments.items()
                          if not name.startswith("_"))
        raise ConfigError(f"optimizer._target_={options._target_} refused its arguments ({given}): "
                          f"{type(exc).__name__}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _text(value) -> str:
    """A value as an override writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
