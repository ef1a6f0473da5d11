"""strategy.name -> adapter class. Adding a strategy: one file here, one line below, one yaml in conf/strategy/."""
from __future__ import annotations

import torch
from omegaconf import DictConfig, open_dict

from framework.errors import ConfigError
from framework.launch.environment import HOROVOD
from framework.strategies.base import Strategy, cuda_wanted
from framework.strategies.ddp import DDPStrategy
from framework.strategies.deepspeed import DeepSpeedStrategy
from framework.strategies.dp import DataParallelStrategy
from framework.strategies.horovod import HorovodStrategy
from framework.strategies.single import SingleStrategy

STRATEGIES: dict[str, type[Strategy]] = {
    "single": SingleStrategy,
    "dp": DataParallelStrategy,
    "ddp": DDPStrategy,
    "deepspeed": DeepSpeedStrategy,  # imports DeepSpeed itself only in its workers
    "horovod": HorovodStrategy,  # imports horovod only when chosen
}


def resolve_auto(cfg: DictConfig, launcher: str | None) -> str:
    """strategy=auto becomes ddp over all GPUs (or the workers an outer torch launcher started) when there are
    several, else single. Returns the note to show, or an empty string."""
    if cfg.strategy.name != "auto":
        return ""
    if launcher == HOROVOD:  # auto's options are ddp's: guessing horovod would run it without its own settings
        raise ConfigError("strategy=auto is not allowed under horovodrun: name the engine the workers were started "
                          "for, strategy=horovod")
    several = launcher is not None or (cuda_wanted(cfg) and torch.cuda.device_count() > 1)
    chosen = "ddp" if several else "single"
    with open_dict(cfg):
        cfg.strategy.name = chosen
    reason = "several GPUs/workers" if several else "at most one GPU"
    return f"strategy=auto chose {chosen} ({reason})"


def build_strategy(cfg: DictConfig) -> Strategy:
    return STRATEGIES[cfg.strategy.name](cfg)


def strategy_names() -> list[str]:
    return list(STRATEGIES)


__all__ = ["STRATEGIES", "Strategy", "build_strategy", "resolve_auto", "strategy_names"]
