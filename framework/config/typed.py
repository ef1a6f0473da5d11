"""A config node as its typed schema, and OmegaConf's errors as the one line users get.

typed(TrainerConfig, cfg.trainer, "trainer") merges the node into the dataclass schema (OmegaConf checks types and,
for a closed schema, refuses unknown keys), then instantiates it (the schema's rules and cross-key checks run). Any
failure becomes a ConfigError naming the full key, the value and what is allowed. The same translation serves
Hydra's composition errors (framework/cli.py), where a schema-typed YAML meets an override of the wrong type."""
from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from framework.config.rules import SettingError, allowed_text
from framework.common.errors import ConfigError, first_line

T = TypeVar("T")


def typed(schema: type[T], node: Any, key: str, open_keys: bool = False) -> T:
    """`node` (a config node or a plain mapping; interpolations resolved first) as an instance of `schema`.
    open_keys=True: keys the schema does not declare are kept, as attributes (component options passed on)."""
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    # a dataclass is closed by nature (its own keys only) while its Dict fields stay open; struct=False opens it
    base = OmegaConf.structured(schema, flags={"struct": False} if open_keys else None)
    try:
        return OmegaConf.to_object(OmegaConf.merge(base, node or {}))
    except SettingError as exc:
        raise ConfigError(setting_error_line(exc, key)) from None
    except OmegaConfBaseException as exc:
        raise ConfigError(omegaconf_error_line(exc, key)) from None


def setting_error_line(exc: SettingError, key: str) -> str:
    if exc.message:
        return exc.message.replace("{key}", key)
    return f"{key}.{exc}" if key else str(exc)


def omegaconf_error_line(exc: OmegaConfBaseException, prefix: str = "") -> str:
    """One line for a type or key error OmegaConf raised: the full key, the value and what is allowed."""
    full_key = _full_key(exc, prefix)
    schema = getattr(exc, "object_type", None)
    name = getattr(exc, "key", None)
    if isinstance(exc, (ConfigKeyError, ConfigAttributeError)) and dataclasses.is_dataclass(schema):
        return f"{full_key} is not allowed: {missing_key_reason(exc, prefix)}"
    if isinstance(exc, ValidationError) and dataclasses.is_dataclass(schema) and name is not None:
        return f"{full_key}={getattr(exc, 'value', None)!r} is not allowed: expected {allowed_text(schema, str(name))}"
    line = first_line(exc) or type(exc).__name__
    return f"{full_key}: {line}" if full_key else line


def missing_key_reason(exc: ConfigKeyError | ConfigAttributeError, prefix: str = "") -> str:
    """Why a key OmegaConf did not find is refused: where it was looked for and, for a schema, the keys there are."""
    schema = getattr(exc, "object_type", None)
    if not dataclasses.is_dataclass(schema):
        return first_line(exc) or type(exc).__name__
    where = _full_key(exc, prefix).rpartition(".")[0] or "the config"
    known = ", ".join(f.name for f in dataclasses.fields(schema) if not f.name.startswith("_"))
    return f"{where} has no key {getattr(exc, 'key', None)!r} (its keys: {known})"


def _full_key(exc: OmegaConfBaseException, prefix: str) -> str:
    return ".".join(k for k in (prefix, str(getattr(exc, "full_key", "") or "")) if k)
