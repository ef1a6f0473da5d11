"""Hydra callback that claims a fresh run (or sweep) folder before Hydra writes into it.

Two runs started in the same second would otherwise share `outputs/runs/<second>_<strategy>_<model>`:
the folder is claimed with an atomic mkdir, and a taken name gets a `-2`, `-3`... suffix. A folder the
user names (hydra.run.dir=..., e.g. to resume a run) is used as it is. An output folder that cannot be
created stops the run here with one clear message instead of a Hydra stack trace."""
from __future__ import annotations

import os
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, read_write

from framework.common.errors import ConfigError, RefusedInHydra


def _user_named(config: DictConfig, key: str) -> bool:
    return any(o.startswith(f"{key}=") for o in config.hydra.overrides.hydra)


def claim(folder: Path) -> Path:
    folder.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = folder, 1
    while True:
        try:
            os.mkdir(candidate)
            return candidate
        except FileExistsError:
            n += 1
            candidate = folder.with_name(f"{folder.name}-{n}")


def _claim_or_refuse(config: DictConfig, key: str) -> Path | None:
    HydraConfig.instance().set_config(config)  # lets ${hydra:runtime.choices...} resolve this early
    folder = Path(str(config.hydra[key.split(".")[1]].dir))
    try:
        if _user_named(config, key):
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / ".write_probe"
            probe.touch()
            probe.unlink()
            return None
        return claim(folder)
    except OSError as exc:  # a refusal like any other, which the command says with its session
        raise RefusedInHydra(ConfigError(
            f"{key}={folder} is not allowed: the output folder cannot be created or written ({exc.strerror}: "
            f"{exc.filename}); choose a writable folder with {key}=PATH")) from None


class ClaimRunFolder(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        claimed = _claim_or_refuse(config, "hydra.run.dir")
        if claimed is not None:
            with read_write(config.hydra.run):
                config.hydra.run.dir = str(claimed)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        claimed = _claim_or_refuse(config, "hydra.sweep.dir")
        if claimed is not None:
            # Each job's config is recomposed from the hydra overrides, so the claimed folder goes there.
            with read_write(config.hydra.overrides):
                config.hydra.overrides.hydra.append(f"hydra.sweep.dir={claimed}")
            with read_write(config.hydra.sweep):
                config.hydra.sweep.dir = str(claimed)
            # HydraConfig holds a copy: without this the driver's ${now:...} would resolve again, to a later second
            # (what a stopped joblib sweep's resume command reads)
            HydraConfig.instance().set_config(config)
