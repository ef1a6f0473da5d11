"""What differs between the Hydra versions the framework runs on (pyproject.toml: 1.3; `make test-hydra14` runs the
in-process tests against 1.4 too), in one place.

    version_base  1.3 asks for one (without it, it warns and keeps 1.1's defaults); 1.4 deprecates the parameter
                  and its defaults are 1.3's, so it is left out there
    whitelist     1.4 checks every `_target_` Hydra itself builds (hydra.callbacks, logging handlers) against an
                  execution whitelist given to @hydra.main; 1.5 will require one. Ours: the framework's Hydra
                  callbacks. The components are built through framework/config/targets.py, with their own list.
    resolvers     OmegaConf 2.4 (Hydra 1.4's) renames register_new_resolver to register_resolver, a name 2.3 still
                  gives its old, deprecated API"""
from __future__ import annotations

from typing import Callable

import hydra
import omegaconf
from omegaconf import OmegaConf

VERSION = tuple(int(part) for part in hydra.__version__.split(".")[:2])
OMEGACONF = tuple(int(part) for part in omegaconf.__version__.split(".")[:2])
HYDRA_CALLBACKS = ("framework.results.*",)  # conf/hydra/default.yaml, conf/logger/*.yaml: hydra.callbacks


def version_base() -> dict:
    """The version_base argument of @hydra.main, initialize(), initialize_config_dir() for this Hydra."""
    return {} if VERSION >= (1, 4) else {"version_base": "1.3"}


def main_options() -> dict:
    """@hydra.main's keyword arguments besides the config path and name."""
    return {**version_base(), **({"execution_whitelist": list(HYDRA_CALLBACKS)} if VERSION >= (1, 4) else {})}


def register_resolver(name: str, resolver: Callable) -> None:
    """An OmegaConf resolver, `${name:...}`, registered again if it was (a module imported anew)."""
    register = OmegaConf.register_resolver if OMEGACONF >= (2, 4) else OmegaConf.register_new_resolver
    register(name, resolver, replace=True)
