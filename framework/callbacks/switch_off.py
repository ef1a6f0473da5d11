"""What verify.py (framework/verify/) switches off in both of its runs to see whether a difference from one process
goes away: modules held in evaluation mode while the model trains, from the first step on.

    batchnorm_statistics   BatchNorm layers normalize with their running statistics (never updated then), not the
                           micro-batch's: what every rank computes no longer depends on how the batch was split
    training_mode_draws    every other module in evaluation mode: Dropout (and a forward's own draws that follow
                           `self.training`, as functional dropout does) draws nothing; BatchNorm stays as it is

A callback like any other (`+callbacks.<name>._target_=framework.callbacks.switch_off.SwitchOff`), so the runs are
train.py runs of the user's config with one thing changed."""
from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase

from framework.callbacks.base import Callback
from framework.config.rules import one_of, require

BATCHNORM_STATISTICS = "batchnorm_statistics"
TRAINING_MODE_DRAWS = "training_mode_draws"


def held_in_eval_mode(model: nn.Module, what: str) -> list[nn.Module]:
    """The modules `what` holds in evaluation mode. _BatchNorm and _NormBase are the bases torch's BatchNorm and
    InstanceNorm layers share (torch names no public one)."""
    if what == BATCHNORM_STATISTICS:
        return [m for m in model.modules() if isinstance(m, _BatchNorm)]
    return [m for m in model.modules() if not isinstance(m, _NormBase)]


class SwitchOff(Callback):
    def __init__(self, what: str):
        self.what = require("callbacks.switch_off.what", what,
                            one_of(BATCHNORM_STATISTICS, TRAINING_MODE_DRAWS,
                                   allowed=f"{BATCHNORM_STATISTICS} or {TRAINING_MODE_DRAWS}"))
        self.modules: list[nn.Module] = []

    def on_fit_start(self, state) -> None:
        self.modules = held_in_eval_mode(state.model, self.what)

    def on_train_step_start(self, state, step: int) -> None:
        # the loop puts the model back in training mode at every epoch's start and after each evaluation
        for module in self.modules:
            module.training = False
