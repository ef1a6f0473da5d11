"""Strategies are components: each conf/strategy/*.yaml names its engine class with `_target_` (a Strategy
subclass, framework/strategies/base.py, built as cls(options, trainer, ranks=ranks) from its own typed options,
`Options`, the trainer's engine settings and the Ranks its process was started with, which the session hands in). A
user adds one from their own package and config dir (--config-dir), without editing this repo. `name` stays the
strategy's name in run folders, results and messages."""
from __future__ import annotations

import contextlib
import inspect

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_class
from omegaconf import DictConfig, open_dict

from framework.config.hydra_versions import version_base
from framework.config.lookup import quiet_lookup
from framework.config.legacy_targets import current_target, modernized
from framework.config.strategy_options import MESH_TARGET, MeshOptions
from framework.config.targets import TargetAllowlist, allowing, current
from framework.config.typed import typed
from framework.common.errors import ConfigError, on_one_line
from framework.common.paths import CONF_DIR
from framework.session.environment import HOROVOD, Ranks
from framework.strategies.base import Strategy
from framework.strategies.single import SingleStrategy

GROUP = "strategy"


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def resolve_auto(cfg: DictConfig, outer_kind: str | None) -> str:
    """strategy=auto becomes ddp over all GPUs (or over the ranks torchrun & co. started: outer_kind TORCH) when there
    are several, else single (with single's options only). Returns the note to show, or an empty string."""
    if cfg.strategy.name != "auto":
        return ""
    if outer_kind == HOROVOD:  # auto's options are ddp's: guessing horovod would run it without its own settings
        raise ConfigError("strategy=auto is not allowed under horovodrun: name the engine the workers were started "
                          "for, strategy=horovod")
    accelerator = cfg.trainer.accelerator
    cuda = accelerator == "gpu" or (accelerator == "auto" and torch.cuda.is_available())
    several = outer_kind is not None or (cuda and torch.cuda.device_count() > 1)
    chosen = "ddp" if several else "single"
    if not several:  # auto's options are ddp's: a bad one is refused even where single runs without them
        options = typed(MeshOptions, cfg.strategy, GROUP)
        if options.compression != "none":  # single would drop it
            raise ConfigError(f"strategy.compression={options.compression} is not allowed with strategy=auto here: "
                              "auto chose single (at most one GPU), and one process sends no gradients; use "
                              "strategy=ddp (CPU workers, or one per GPU)")
    with open_dict(cfg):
        if several:
            cfg.strategy.name = chosen
            cfg.strategy._target_ = MESH_TARGET
        else:
            cfg.strategy = {"_target_": class_path(SingleStrategy), "name": chosen}
    reason = "several GPUs/workers" if several else "at most one GPU"
    return f"strategy=auto chose {chosen} ({reason})"


def strategy_class(options) -> type[Strategy]:
    """The Strategy subclass a strategy config node (or plain mapping) names with _target_; ConfigError when it
    names none."""
    target = options.get("_target_") if options is not None else None
    if not target:
        raise ConfigError(f"{GROUP}._target_ is missing: a strategy config names its class with _target_ "
                          f"(e.g. _target_: {MESH_TARGET})")
    target = current_target(str(target))  # an earlier version's name (framework/config/legacy_targets.py)
    current().check_name(target, GROUP)  # the allowlist in force (framework/config/targets.py), before import
    try:
        with quiet_lookup():
            cls = get_class(str(target))
    except Exception as exc:  # hydra wraps the import error; its own text says what failed
        raise ConfigError(f"{GROUP}._target_={target} is not allowed: it cannot be imported "
                          f"({on_one_line(exc)}); is its package on PYTHONPATH?") from None
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise ConfigError(f"{GROUP}._target_={target} is not allowed: it is not a subclass of "
                          f"{class_path(Strategy)} (a strategy answers that interface; see framework/strategies/base.py)")
    if not _takes_ranks(cls):
        raise ConfigError(
            f"{GROUP}._target_={target} is not allowed: its __init__ takes no `ranks`, and a strategy is built as "
            f"{cls.__name__}(options, trainer, ranks=...) with the ranks its process was started with; write "
            "`def __init__(self, options, trainer, ranks)` and hand them to its starter (Elastic(options, "
            "trainer.cuda, backend, trainer.log_all_ranks, ranks)) and its group (TorchGroup.join(self.starter.ranks, "
            "backend, cuda, timeout)); see docs/strategies.md, 'Writing your own strategy'")
    return cls


def _takes_ranks(cls: type[Strategy]) -> bool:
    try:
        inspect.signature(cls).bind(None, None, ranks=None)
    except TypeError:
        return False
    return True


def build_strategy(options, trainer, ranks: Ranks | None) -> Strategy:
    """The strategy its typed options name, for this trainer config (its engine settings) and the ranks this process
    was started with (None: nobody started it as one of several)."""
    return strategy_class({"_target_": options._target_})(options, trainer.engine(), ranks=ranks)


def choose_strategy(cfg: DictConfig, outer: Ranks | None) -> tuple[type[Strategy], str]:
    """Resolve strategy=auto and find the strategy class; where another program started the ranks (`outer`, the
    session's) only a strategy that can train with them (Strategy.outer_kinds) is allowed. Returns (class, note)."""
    kind = outer.kind if outer is not None else None
    note = resolve_auto(cfg, kind) or _modernize(cfg)
    cls = strategy_class(cfg.strategy)
    if kind is not None and kind not in cls.outer_kinds:
        fits = ", ".join(strategies_for_outer_kind(kind))
        raise ConfigError(
            f"strategy={cfg.strategy.name} is not allowed under {outer.started_by}: the launcher already started "
            f"several workers; use strategy={fits}{' or auto' if kind != HOROVOD else ''}")
    return cls, note


def _modernize(cfg: DictConfig) -> str:
    """An earlier version's strategy class named by the config: today's, with the degrees it meant. Returns the
    line saying what to write now ('' when the config names today's)."""
    target = cfg.strategy.get("_target_")
    node, note = modernized({key: None for key in cfg.strategy} | {"_target_": target})
    if note:
        with open_dict(cfg):
            for key, value in node.items():
                if key == "_target_" or key not in cfg.strategy:
                    cfg.strategy[key] = value
    return note


@contextlib.contextmanager
def _config_search_path():
    """Hydra's current search path (inside @hydra.main or initialize_config_dir: with a user's --config-dir), else
    this repo's conf/."""
    if GlobalHydra.instance().is_initialized():
        yield GlobalHydra.instance()
        return
    with initialize_config_dir(config_dir=str(CONF_DIR), **version_base()):
        yield GlobalHydra.instance()


def strategy_names() -> list[str]:
    """Every entry of the strategy config group on the search path (conf/strategy and a user's --config-dir)."""
    with _config_search_path() as hydra:
        # Hydra's config loader is the one public way to list a group's options on the current search path
        return hydra.config_loader().get_group_options(GROUP)


def strategies_for_outer_kind(kind: str) -> list[str]:
    """Names of the group's strategies whose class can train with ranks of this kind (TORCH, HOROVOD) that another
    program started."""
    fits = []
    with _config_search_path():
        for name in strategy_names():
            try:
                options = compose(f"{GROUP}/{name}")[GROUP]
                # an entry of this command's own search path (conf/, the user's --config-dir) is trusted as named;
                # its other values may interpolate the rest of the config (${trainer.grad_accum}): not resolved here
                with allowing(TargetAllowlist.of_command({"_target_": options.get("_target_")})):
                    fits_kind = options.get("name") != "auto" and kind in strategy_class(options).outer_kinds
                if fits_kind:
                    fits.append(name)
            except Exception:  # an entry that does not compose or import cannot be suggested
                continue
    return fits


__all__ = ["Strategy", "build_strategy", "choose_strategy", "class_path", "resolve_auto", "strategies_for_outer_kind",
           "strategy_class", "strategy_names"]
