"""Small typed checks on a composed config. Each failure names the key, the value and what is allowed."""
from __future__ import annotations

from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf

from framework.errors import ConfigError

_MISSING = object()


def value_at(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key, default=_MISSING)
    if value is _MISSING:
        raise ConfigError(f"{key} is missing from the config")
    return value


def fail(key: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def int_at_least(cfg: DictConfig, key: str, minimum: int, optional: bool = False) -> int | None:
    value = value_at(cfg, key)
    if value is None and optional:
        return None
    if not _is_int(value) or value < minimum:
        fail(key, value, f"expected an integer >= {minimum}" + (" or null" if optional else ""))
    return value


def positive_number(cfg: DictConfig, key: str, optional: bool = False) -> float | None:
    value = value_at(cfg, key)
    if value is None and optional:
        return None
    if not _is_number(value) or not value > 0:
        fail(key, value, "expected a number > 0" + (" or null" if optional else ""))
    return float(value)


def number_above(cfg: DictConfig, key: str, low: float) -> float:
    value = value_at(cfg, key)
    if not _is_number(value) or not value > low:
        fail(key, value, f"expected a number > {low:g}")
    return float(value)


def number_in(cfg: DictConfig, key: str, low: float, high: float, high_open: bool = False) -> float:
    value = value_at(cfg, key)
    ok = _is_number(value) and low <= value and (value < high if high_open else value <= high)
    if not ok:
        fail(key, value, f"expected a number in [{low}, {high}{')' if high_open else ']'}")
    return float(value)


def boolean(cfg: DictConfig, key: str) -> bool:
    value = value_at(cfg, key)
    if not isinstance(value, bool):
        fail(key, value, "expected true or false")
    return value


def one_of(cfg: DictConfig, key: str, choices: Iterable[Any]) -> Any:
    choices = list(choices)
    value = value_at(cfg, key)
    if value not in choices:
        fail(key, value, "expected one of " + ", ".join(str(c) for c in choices))
    return value


def int_list(cfg: DictConfig, key: str, minimum: int, optional: bool = False) -> list[int] | None:
    value = value_at(cfg, key)
    if value is None and optional:
        return None
    items = list(value) if OmegaConf.is_list(value) or isinstance(value, (list, tuple)) else None
    if not items or not all(_is_int(v) and v >= minimum for v in items):
        fail(key, value, f"expected a non-empty list of integers >= {minimum}" + (" or null" if optional else ""))
    return items
