"""The optimizer from its typed options (conf/optimizer/*.yaml: `_target_` + `_partial_`, any torch optimizer;
framework/config/optimizer.py), with optional linear lr scaling.

lr_scaling=linear multiplies the configured lr by the number of workers (processes or dp replicas): the rule of the
data-parallel tutorials for when the batch grows with the workers. Our trainer.batch_size is global, so keep
lr_scaling=none unless you also scale the batch with the workers.
"""
from __future__ import annotations

import hydra.utils

from framework.config.optimizer import OptimizerConfig


def build_optimizer(options: OptimizerConfig, params, workers: int):
    return hydra.utils.instantiate(options.constructor_arguments(workers))(params)
