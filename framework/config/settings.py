"""The whole run's config as typed settings: what the driver builds once from Hydra's composed config, checks, and
hands to every worker (with the run folder, as the Payload). Only the driver (framework/run.py) and the worker's
assembly (framework/worker.py) see it whole; each component is built from, and receives, its own part."""
from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError

from framework.config.dataset import DatasetConfig
from framework.config.foreign_keys import dangling_interpolation_line, unused_entry_key_line
from framework.config.optimizer import LrScheduleConfig, OptimizerConfig
from framework.config.strategy_options import StrategyOptions
from framework.config.targets import TargetAllowlist
from framework.config.trainer import TrainerConfig
from framework.config.typed import typed
from framework.common.errors import ConfigError


DEFAULT_STEP = "framework.training.step.Supervised"


@dataclass
class Settings:
    trainer: TrainerConfig
    strategy: StrategyOptions  # the Options of the strategy class its _target_ names
    optimizer: OptimizerConfig  # with the optimizer's own keyword arguments as attributes
    lr_schedule: LrScheduleConfig
    dataset: DatasetConfig  # with the dataset config's own keys as attributes
    model: dict  # components: each a node with _target_, built by hydra.utils.instantiate
    loss: dict
    metrics: dict  # name -> component
    callbacks: dict  # name -> component (framework/callbacks/base.py)
    step: dict  # how a batch becomes outputs and a loss (framework/training/step.py)
    # the `_target_`s this run may build: allowed_targets and what its command composed (framework/config/targets.py)
    targets: TargetAllowlist = field(default_factory=TargetAllowlist)

    @property
    def model_name(self) -> str:
        return str(self.model.get("_target_", "model")).rsplit(".", 1)[-1]


@dataclass
class Payload:
    """What every worker gets: the settings and the run folder (plain data: nothing is composed or resolved again in
    a worker, so no second `${now:}` and no second Hydra run)."""

    settings: Settings
    run_dir: str
    resume: Any = None  # the checkpoint the driver chose and verified (framework/checkpoints/store.py), or None


def _schema_of(node, default: type) -> type:
    """The schema Hydra composed the node with (conf/optimizer/sgd.yaml: SGDConfig), else the group's own."""
    schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    return schema if dataclasses.is_dataclass(schema) and issubclass(schema, default) else default


def settings_of(cfg: DictConfig, strategy_options: type[StrategyOptions], dataset_as_written: bool = True,
                targets: TargetAllowlist | None = None) -> Settings:
    """Every group of the composed config as its typed options (the strategy's as strategy_options: the Options of
    the class its _target_ names); ConfigError naming the key on a bad value. dataset_as_written=False: the dataset
    node was resolved already (a run's saved config), so its own keys' uses by interpolation cannot be seen, and are
    not asked for. targets: the `_target_`s the run may build; by default what this config allows (a training run
    trusts the config its user composed)."""
    if dataset_as_written:
        _refuse_unused_dataset_keys(cfg)
    plain = OmegaConf.to_container(cfg, resolve=True)
    return Settings(
        trainer=typed(TrainerConfig, plain["trainer"], "trainer"),
        strategy=typed(strategy_options, plain["strategy"], "strategy"),
        optimizer=typed(_schema_of(cfg.optimizer, OptimizerConfig), plain["optimizer"], "optimizer", open_keys=True),
        lr_schedule=typed(LrScheduleConfig, plain["lr_schedule"], "lr_schedule"),
        dataset=typed(DatasetConfig, plain["dataset"], "dataset", open_keys=True),
        model=plain["model"], loss=plain.get("loss"), metrics=plain.get("metrics") or {},
        callbacks=plain.get("callbacks") or {}, step=plain.get("step") or {"_target_": DEFAULT_STEP},
        targets=targets if targets is not None else TargetAllowlist.of_command(cfg),
    )


def refuse_dangling_interpolations(cfg: DictConfig) -> None:
    """The composed config resolves: a key some entry interpolates may have been taken out (`~dataset.download`;
    Hydra >= 1.4 also takes out one whose value is null). ConfigError naming both keys, not OmegaConf's traceback."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except InterpolationKeyError as exc:
        missing = re.search(r"Interpolation key '([^']+)'", str(exc))
        raise ConfigError(dangling_interpolation_line(str(exc.full_key), missing.group(1) if missing else "?")) from None


def _refuse_unused_dataset_keys(cfg: DictConfig) -> None:
    """A dataset config may add keys of its own for its components to interpolate (root: ${dataset.root}); one that
    nothing uses is a typo or a misplaced option (the dataset schema is open, so Hydra lets it through). A key is used
    when the config no longer resolves without it (OmegaConf finds every interpolation, relative ones too)."""
    if cfg.dataset.get("_target_"):  # one Dataset: its keys are its own arguments, which it checks
        return
    declared = {f.name for f in dataclasses.fields(DatasetConfig)}
    plain = OmegaConf.to_container(cfg, resolve=False)
    for key in cfg.dataset:
        if key not in declared and not _interpolated(plain, str(key)):
            raise ConfigError(unused_entry_key_line("dataset", str(key)) or (
                f"dataset.{key} is not allowed: the dataset config has no key {key!r} and none of its components "
                f"uses it (keys every dataset has: {', '.join(sorted(declared))}; a component's own option goes "
                f"under it, e.g. dataset.train.{key})"))


def _interpolated(plain: dict, key: str) -> bool:
    """Whether an interpolation of the config (as a plain container, interpolations unresolved) needs dataset.<key>:
    without it, the config no longer resolves."""
    without = copy.deepcopy(plain)
    del without["dataset"][key]
    try:
        OmegaConf.resolve(OmegaConf.create(without))
    except InterpolationKeyError:
        return True
    return False
