"""One process on one device: the first GPU when there is one, else the CPU."""
from __future__ import annotations

import torch
from torch import nn

from framework.config.strategy_options import SingleOptions
from framework.session.environment import Ranks
from framework.strategies.base import Strategy
from framework.strategies.starters import InProcess
from framework.training.checkpoint_io import CheckpointIO
from framework.training.engine import LocalGroup, ProcessGroup, Wrapped
from framework.training.precision import Precision


class SingleStrategy(Strategy):
    Options = SingleOptions
    muon_steps = "whole"

    def __init__(self, options: SingleOptions, trainer, ranks: Ranks | None):
        where = f"1 process(es) on {'the GPU' if trainer.cuda else 'the CPU'}"
        super().__init__(options, trainer, InProcess(where, ranks))

    def join(self) -> ProcessGroup:
        return LocalGroup(torch.device("cuda", torch.cuda.current_device()) if self.trainer.cuda else torch.device("cpu"))

    def parallelize(self, model: nn.Module, make_optimizer, group: ProcessGroup) -> Wrapped:
        return Wrapped(model, make_optimizer(model.parameters()), Precision(self.trainer.precision, group.device),
                       CheckpointIO(group.rank, group.world_size, group.cuda_devices), model)
