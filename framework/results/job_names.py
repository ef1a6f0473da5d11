"""Sweep job folders named by what varies: `python train.py -m optimizer.lr=0.1,0.01 trainer.seed=1,2,3` makes
`<sweep>/0_lr=0.1_seed=1`, `1_lr=0.1_seed=2`, ... instead of six `<n>_<strategy>_<model>` folders that differ only
by their number.

What varies is known before the first job: the sweep's overrides that are sweeps (`a,b`, `range()`, `choice()`,
`interval()`, `glob()`), on the command line or in hydra.sweeper.params (an experiment's or Optuna's). The Hydra
callback puts `hydra.sweep.subdir=<job number>_${hydra_dist.job_name:<those keys>}` among the overrides every job is
composed from; the resolver then names each job from its own overrides. A key is shortened to its shortest dotted
suffix that no other varying key shares (optimizer.lr -> lr), a value to something a folder name can hold (a path
to its last part, a long float to 4 significant digits, anything still long to a prefix and a hash). A sweep where
nothing varies keeps conf/hydra/default.yaml's `<n>_<strategy>_<model>`; a hydra.sweep.subdir the user sets wins."""
from __future__ import annotations

import hashlib
import re

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, read_write

from framework.config.hydra_versions import register_resolver

RESOLVER = "hydra_dist.job_name"
MAX_VALUE = 24  # characters of one value in a folder name
MAX_NAME = 120  # characters of the whole name


def varying_keys(task_overrides: list[str], sweeper_params: dict | None) -> list[str]:
    """The keys (or config groups) a sweep gives more than one value: the command line's sweep overrides, then
    hydra.sweeper.params' keys that the command line does not pin to one value."""
    parser = OverridesParser.create()
    command_line = parser.parse_overrides(list(task_overrides))
    keys = [o.key_or_group for o in command_line if o.is_sweep_override()]
    pinned = {o.key_or_group for o in command_line}
    for key, value in (sweeper_params or {}).items():
        if key not in pinned and parser.parse_override(f"{key}={value}").is_sweep_override():
            keys.append(key)
    return list(dict.fromkeys(keys))


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each key's shortest dotted suffix that no other key ends with (optimizer.lr -> lr; model.width and
    dataset.width stay whole)."""
    shortened = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            suffix = ".".join(parts[-n:])
            if not any(other != key and (other == suffix or other.endswith("." + suffix)) for other in keys):
                break
        shortened[key] = suffix
    return shortened


def short_value(text: str) -> str:
    text = text.strip().strip("'\"")
    if "/" in text.rstrip("/"):
        text = text.rstrip("/").rsplit("/", 1)[1]
    if len(text) > 8 and re.fullmatch(r"[-+]?\d*\.\d+(e[-+]?\d+)?|[-+]?\d+e[-+]?\d+", text, re.IGNORECASE):
        text = f"{float(text):.4g}"
    text = re.sub(r"[^\w.+\-=@,]", "-", text)
    return _capped(text, MAX_VALUE)


def _capped(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 7] + "~" + hashlib.sha1(text.encode()).hexdigest()[:6]


def overrides_by_key(overrides: list[str]) -> dict[str, str]:
    """A job's overrides as key (or group) -> the value as written (`+x=1` and `++x=1` under x)."""
    found = {}
    for override in overrides:
        key, _, value = override.partition("=")
        found[key.lstrip("+~")] = value
    return found


def job_name(keys: list[str], overrides: list[str]) -> str:
    values, short = overrides_by_key(overrides), short_keys(keys)
    return _capped("_".join(f"{short[k]}={short_value(values[k])}" for k in keys if k in values), MAX_NAME)


def _resolve_job_name(*keys: str, _root_: DictConfig) -> str:
    return job_name(list(keys), list(_root_.hydra.overrides.task))


# Registered on import: every process that resolves a job's folder (the driver, a joblib worker, a submitit task)
# imports this module when it unpickles the sweep's callbacks.
register_resolver(RESOLVER, _resolve_job_name)


def subdir_template(keys: list[str]) -> str:
    return "${hydra.job.num}_${" + RESOLVER + ":" + ",".join(keys) + "}"


class NameJobsByWhatVaries(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if any(o.startswith("hydra.sweep.subdir=") for o in config.hydra.overrides.hydra):
            return
        keys = varying_keys(list(config.hydra.overrides.task), config.hydra.sweeper.get("params"))
        if not keys:
            return
        # Each job's config is recomposed from the hydra overrides (as framework/results/run_folder.py's sweep.dir)
        with read_write(config.hydra.overrides):
            config.hydra.overrides.hydra.append(f"hydra.sweep.subdir='{subdir_template(keys)}'")
