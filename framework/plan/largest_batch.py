"""The largest micro-batch (samples per GPU at a time) that fits a GPU, for one row's strategy and workers, by
planning again, not by a formula alone: a second row at twice the micro-batch gives the bytes one more sample adds
(activations grow with the batch, the model state does not), that line says where the GPU's memory ends, and the
micro-batch found there is planned to check it; a little less while the check says it does not fit. Under pipeline
parallel the micro-batch stays a multiple of strategy.microbatches (the pipeline cuts it in equal parts)."""
from __future__ import annotations

import copy
import math

from omegaconf import DictConfig, open_dict

from framework.plan.rows import Row, micro_batch_multiple, plan_row

CHECKS = 4


def largest_micro_batch(cfg: DictConfig, row: Row, memory: int) -> Row | None:
    """The planned row at the largest micro-batch that fits `memory` bytes, or None where not even one sample fits.
    `row` is the plan of `cfg` as it is."""
    doubled = plan_row(_with_micro_batch(cfg, row, 2 * row.micro_batch))
    per_sample = (doubled.peak - row.peak) / row.micro_batch
    if per_sample <= 0:
        return None
    multiple = micro_batch_multiple(cfg)
    guess = math.floor(row.micro_batch + (memory - row.peak) / per_sample) // multiple * multiple
    for _ in range(CHECKS):
        if guess < 1:
            return None
        checked = plan_row(_with_micro_batch(cfg, row, guess))
        if checked.peak <= memory:
            return checked
        guess = math.floor(guess * memory / checked.peak) // multiple * multiple
    return None


def _with_micro_batch(cfg: DictConfig, row: Row, micro_batch: int) -> DictConfig:
    """The config with trainer.batch_size set so that each data-parallel rank gets `micro_batch` samples at a time."""
    per_step = row.micro_batch and cfg.trainer.batch_size // row.micro_batch  # ranks x grad_accum
    changed = copy.deepcopy(cfg)
    with open_dict(changed):
        changed.trainer.batch_size = micro_batch * per_step
    return changed
