"""Schemas of the optimizer group (`_target_` + `_partial_`: any torch optimizer) and the lr_schedule group.

OptimizerConfig is open: keys it does not declare are the optimizer's own keyword arguments, checked by its
constructor when the driver builds it once. The built-in optimizers' configs declare theirs (SGDConfig, ...)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from framework.config.choices import LrScaling, Schedule
from framework.config.rules import Checked, SettingError, above, between, rule


@dataclass
class OptimizerConfig(Checked):
    _target_: str = "torch.optim.SGD"
    _partial_: bool = True
    lr: float = rule(0.05, above(0))
    # linear: lr x number of workers (processes or dp replicas), the data-parallel tutorials' rule for a batch
    # that grows with the workers; trainer.batch_size is global, so keep none unless you scale it with them
    lr_scaling: LrScaling = LrScaling.none  # none | linear

    def constructor_arguments(self, workers: int) -> dict:
        """What the optimizer class is called with (besides the parameters): every key but lr_scaling, the lr
        scaled by the number of workers when asked."""
        arguments = {k: v for k, v in vars(self).items() if k != "lr_scaling"}
        arguments["lr"] = self.lr * workers if self.lr_scaling == "linear" else self.lr
        return arguments


@dataclass
class SGDConfig(OptimizerConfig):
    momentum: float = rule(0.0, between(0.0, 1.0, high_open=True))
    weight_decay: float = rule(0.0, between(0.0, 1.0))
    nesterov: bool = False

    def check(self) -> None:
        if self.nesterov and not self.momentum:
            raise SettingError("nesterov", True, message="{key}.nesterov=true is not allowed with {key}.momentum="
                               f"{self.momentum}: Nesterov needs a momentum > 0; set one, or nesterov=false")


@dataclass
class AdamConfig(OptimizerConfig):
    _target_: str = "torch.optim.Adam"
    lr: float = rule(0.001, above(0))
    weight_decay: float = rule(0.0, between(0.0, 1.0))
    betas: Optional[List[float]] = None  # null: torch's (0.9, 0.999)
    eps: float = rule(1e-8, above(0))

    def constructor_arguments(self, workers: int) -> dict:
        arguments = super().constructor_arguments(workers)
        if self.betas is None:
            arguments.pop("betas")
        return arguments


@dataclass
class AdamWConfig(AdamConfig):
    _target_: str = "torch.optim.AdamW"
    weight_decay: float = rule(0.01, between(0.0, 1.0))


@dataclass
class LrScheduleConfig(Checked):
    """A factor on the optimizer's lr per step: linear warm-up over warmup_fraction of the run's steps from
    start_factor x lr, then a cosine decay to final_factor x lr at the last step (warmup_cosine), or 1 (constant)."""

    name: Schedule = Schedule.warmup_cosine  # constant | warmup_cosine
    warmup_fraction: float = rule(0.1, between(0.0, 1.0, high_open=True))
    start_factor: float = rule(0.1, between(0.0, 1.0))
    final_factor: float = rule(0.0, between(0.0, 1.0))
