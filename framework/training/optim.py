"""Optimizer from conf/optimizer/*.yaml (_target_ + _partial_), with optional linear LR scaling.

lr_scaling=linear multiplies the configured lr by the number of workers (processes or dp replicas):
the rule of the data-parallel tutorials for when the batch grows with the workers. Our
trainer.batch_size is global, so keep lr_scaling=none unless you also scale the batch with the workers.
"""
from __future__ import annotations

import hydra.utils
from omegaconf import DictConfig, OmegaConf

_NOT_CONSTRUCTOR_ARGS = ("lr_scaling",)


def effective_lr(cfg: DictConfig, workers: int) -> float:
    lr = float(cfg.optimizer.lr)
    return lr * workers if cfg.optimizer.lr_scaling == "linear" else lr


def build_optimizer(cfg: DictConfig, params, workers: int):
    options = OmegaConf.to_container(cfg.optimizer, resolve=True)
    for key in _NOT_CONSTRUCTOR_ARGS:
        options.pop(key, None)
    options["lr"] = effective_lr(cfg, workers)
    factory = hydra.utils.instantiate(options)
    return factory(params)
