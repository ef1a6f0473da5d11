"""Libraries that come with an extra of hydra-dist, not with its core install: a component naming one that is not
installed is refused in one line that names the install command."""
from __future__ import annotations

import importlib
import importlib.util

from framework.common.errors import ConfigError

# a _target_'s top-level package -> the extra that installs it (pyproject.toml)
EXTRAS = {"transformers": "hf", "datasets": "hf", "timm": "hf", "mlflow": "mlflow", "wandb": "wandb", "deepspeed": "deepspeed"}


def install_hint(extra: str) -> str:
    return f"install it with `pip install 'hydra-dist[{extra}]'` (or `make setup`, which installs every extra)"


def missing_extra(target: str) -> str | None:
    """Why `target` cannot be imported when its package belongs to an extra that is not installed; else None."""
    package = str(target).split(".", 1)[0]
    if package not in EXTRAS:
        return None
    try:
        importlib.import_module(package)
    except ImportError:
        return f"{package} is not installed (the {EXTRAS[package]} extra); {install_hint(EXTRAS[package])}"
    return None


def import_extra(package: str):
    """An extra's package, imported where it is needed; a missing one is a RuntimeError naming the install command."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise RuntimeError(f"{package} cannot be imported ({exc}); {install_hint(EXTRAS[package])}") from None


def require_extra(package: str, needed_by: str) -> None:
    """A missing extra said in one line, without importing it (seconds of imports for some): `needed_by` is the
    choice that needs it, e.g. "logger=wandb"."""
    if importlib.util.find_spec(package) is None:
        raise ConfigError(missing_line(package, needed_by))


def missing_line(package: str, needed_by: str) -> str:
    return f"{needed_by} needs {package}, an optional extra that is not installed; {install_hint(EXTRAS[package])}"
