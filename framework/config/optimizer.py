"""Schemas of the optimizer group (`_target_` + `_partial_`: any torch optimizer) and the lr_schedule group.

OptimizerConfig is open: keys it does not declare are the optimizer's own keyword arguments. The built-in optimizers'
configs declare theirs (SGDConfig, ...), with ranges; what an optimizer's constructor refuses (SGD's nesterov without
momentum, a keyword it does not take) it says itself when the driver builds it once (framework/training/optim.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from framework.config.choices import LrScaling, Schedule
from framework.config.rules import Checked, SettingError, above, at_least, at_least_number, between, one_of, rule


@dataclass
class OptimizerConfig(Checked):
    _target_: str = "torch.optim.SGD"
    _partial_: bool = True
    lr: float = rule(0.05, above(0))
    # linear: lr x number of workers (processes or dp replicas), the data-parallel tutorials' rule for a batch
    # that grows with the workers; trainer.batch_size is global, so keep none unless you scale it with them
    lr_scaling: LrScaling = LrScaling.none  # none | linear
    # groups of parameters with settings of their own: [{params: [name patterns], lr_scale, weight_decay, ...}]
    # (framework/training/param_groups.py; presets: +optimizer/param_groups=no_decay|backbone)
    param_groups: List[Dict[str, Any]] = field(default_factory=list)

    def constructor_arguments(self, workers: int) -> dict:
        """What the optimizer class is called with (besides the parameters): every key but ours (lr_scaling,
        param_groups), the lr scaled by the number of workers when asked."""
        arguments = {k: v for k, v in vars(self).items() if k not in ("lr_scaling", "param_groups")}
        arguments["lr"] = self.lr * workers if self.lr_scaling == "linear" else self.lr
        return arguments


@dataclass(kw_only=True)
class SGDConfig(OptimizerConfig):
    momentum: float = rule(0.0, between(0.0, 1.0, high_open=True))
    weight_decay: float = rule(0.0, at_least_number(0))
    nesterov: bool = False  # needs momentum > 0 (torch.optim.SGD's own rule, said when the driver builds it)


@dataclass(kw_only=True)
class AdamConfig(OptimizerConfig):
    _target_: str = "torch.optim.Adam"
    lr: float = rule(0.001, above(0))
    weight_decay: float = rule(0.0, at_least_number(0))
    betas: Optional[List[float]] = None  # null: torch's (0.9, 0.999)
    eps: float = rule(1e-8, above(0))

    def constructor_arguments(self, workers: int) -> dict:
        arguments = super().constructor_arguments(workers)
        if self.betas is None:
            arguments.pop("betas")
        return arguments


@dataclass(kw_only=True)
class AdamWConfig(AdamConfig):
    _target_: str = "torch.optim.AdamW"
    weight_decay: float = rule(0.01, at_least_number(0))


MUON_LR_ADJUSTMENTS = ("original", "match_rms_adamw", "spectral_unclamped")
MUON_TARGET = "framework.training.muon.MuonWithAdamW"


@dataclass(kw_only=True)
class MuonConfig(OptimizerConfig):
    """optimizer=muon: torch.optim.Muon on the hidden 2-D matrices, AdamW on embeddings, the output layer, norms,
    biases and conv kernels (framework/training/muon.py; the rule: framework/training/param_groups.py). lr and
    weight_decay are both's; match_rms_adamw scales Muon's update to AdamW's size, so one lr serves both."""

    _target_: str = MUON_TARGET
    lr: float = rule(0.001, above(0))
    weight_decay: float = rule(0.1, at_least_number(0))
    momentum: float = rule(0.95, between(0.0, 1.0, high_open=True))
    nesterov: bool = True
    ns_steps: int = rule(5, at_least(1))
    adjust_lr_fn: str = rule("match_rms_adamw", one_of(*MUON_LR_ADJUSTMENTS))
    adamw_betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    adamw_eps: float = rule(1e-8, above(0))

    def check(self) -> None:
        if self._target_ != MUON_TARGET:  # its groups say use_muon, which another optimizer would ignore
            raise SettingError("_target_", self._target_, message=(
                f"{{key}}._target_={self._target_} is not allowed with optimizer=muon: its param groups are made for "
                f"{MUON_TARGET}; choose that optimizer's own preset instead (optimizer=adamw, ...)"))
        if len(self.adamw_betas) != 2 or not all(0 <= b < 1 for b in self.adamw_betas):
            raise SettingError("adamw_betas", self.adamw_betas, "two numbers in [0, 1), e.g. [0.9, 0.95]")


@dataclass
class LrScheduleConfig(Checked):
    """A factor on the optimizer's lr per step: linear warm-up over warmup_fraction of the run's steps from
    start_factor x lr, then a cosine decay to final_factor x lr at the last step (warmup_cosine), or 1 (constant).
    name=torch: `scheduler`, any torch.optim.lr_scheduler class by _target_ (built on the optimizer, stepped once
    per optimizer step; ReduceLROnPlateau on trainer.objective at each evaluation; framework/training/lr_schedule.py).
    """

    name: Schedule = Schedule.warmup_cosine  # constant | warmup_cosine | torch
    warmup_fraction: float = rule(0.1, between(0.0, 1.0, high_open=True))
    start_factor: float = rule(0.1, between(0.0, 1.0))
    final_factor: float = rule(0.0, between(0.0, 1.0))
    # name=torch: {_target_: torch.optim.lr_scheduler.StepLR, ...}; typed Any: an override's dict replaces null
    # (OmegaConf 2.3 cannot merge one into a null Dict node)
    scheduler: Any = None

    def check(self) -> None:
        if self.scheduler is not None and not isinstance(self.scheduler, dict):
            raise SettingError("scheduler", self.scheduler, message=(
                f"{{key}}.scheduler={self.scheduler!r} is not allowed: expected a torch.optim.lr_scheduler class by "
                "_target_, e.g. {key}.scheduler={_target_:torch.optim.lr_scheduler.ExponentialLR,gamma:0.99}"))
        if self.name == "torch" and not (self.scheduler and self.scheduler.get("_target_")):
            raise SettingError("scheduler", self.scheduler, message=(
                "{key}.scheduler is missing: lr_schedule=torch names a torch.optim.lr_scheduler class by _target_, "
                "e.g. {key}.scheduler={_target_:torch.optim.lr_scheduler.ExponentialLR,gamma:0.99} (presets: "
                "lr_schedule=step, one_cycle, plateau)"))
        if self.name != "torch" and self.scheduler is not None:
            raise SettingError("scheduler", self.scheduler, message=(
                f"{{key}}.scheduler is not allowed with {{key}}.name={self.name}: it is read only with "
                "lr_schedule=torch (name: torch)"))
