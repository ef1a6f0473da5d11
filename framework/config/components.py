"""Instantiate a user-pickable component (dataset split, loss, metric, augmentation) from its config node, with
one clear error that names the key and the `_target_` when it cannot be built; every `_target_` goes through the
allowlist in force (framework/config/targets.py) before anything is imported."""
from __future__ import annotations

import inspect
from typing import Any

from hydra.errors import InstantiationException

from framework.common.errors import ConfigError
from framework.config.extras import missing_extra
from framework.config.foreign_keys import foreign_key_line, foreign_keys
from framework.config.targets import current, instantiate, locate


def _cause(exc: BaseException) -> BaseException:
    while isinstance(exc, InstantiationException) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def build_component(node, key: str, **kwargs) -> Any:
    """instantiate(node, **kwargs); `key` is where node sits in the config (e.g. dataset.train). node is a config
    node or a plain mapping (the typed settings keep components as mappings)."""
    if node is None or not hasattr(node, "get") or "_target_" not in node:
        raise ConfigError(f"{key} is missing or has no _target_ naming the class (or function) to build")
    if not node.get("_target_"):  # an entry with no class of its own (conf/<group>/custom.yaml) until one is named
        raise ConfigError(f"{key}._target_ is not set: name the class (or function) to build, e.g. "
                          f"{key}._target_=mypkg.MyClass")
    target = node.get("_target_")
    try:
        return instantiate(node, key, **kwargs)
    except InstantiationException as exc:
        cause = _cause(exc)
        if isinstance(cause, ConfigError):
            raise cause from None
        _refuse_foreign_keys(node, key, target)
        if "Error locating target" in str(exc):
            missing = missing_extra(str(target))
            if missing:
                raise ConfigError(f"{key}._target_={target} is not allowed here: {missing}") from None
            raise ConfigError(f"{key}._target_={target} is not allowed: it cannot be imported ({cause}); "
                              "is its package on PYTHONPATH?") from None
        raise ConfigError(f"{key}._target_={target} failed to build: {type(cause).__name__}: {cause}") from None
    except ConfigError:  # the component's own refusal (Hydra >= 1.4 does not wrap what the target raises)
        raise
    except Exception as exc:  # Hydra >= 1.4: the target's own error, unwrapped
        _refuse_foreign_keys(node, key, target)
        raise ConfigError(f"{key}._target_={target} failed to build: {type(exc).__name__}: {exc}") from None


def _refuse_foreign_keys(node, key: str, target) -> None:
    """A build that failed on keys its class does not take: where they came from, and what leaves them out."""
    parameters = parameters_of(str(target), key)
    foreign = foreign_keys(node, parameters)
    if foreign:
        raise ConfigError(foreign_key_line(key, str(target), foreign, parameters)) from None


def parameters_of(target: str, key: str = "") -> dict[str, inspect.Parameter]:
    """The parameters of the class or function a `_target_` names (at `key`), by name; {} when it cannot be imported
    or has no signature (build_component then says what is wrong). ConfigError when the allowlist in force refuses
    it: it is imported only after that."""
    if not target:
        return {}
    current().check_name(target, key or "component")
    try:
        return dict(inspect.signature(locate(str(target))).parameters)
    except Exception:
        return {}
