"""Learning-rate schedules (conf/lr_schedule/*.yaml), applied to every param group.

The built-in ones (constant, warmup_cosine) are a factor of each param group's configured lr: a pure function of
the optimizer step, so a resumed run continues the same curve from its checkpointed step and nothing extra is saved.
The configured lr stays in each param group as `initial_lr` (torch's own schedulers use the same key), which
checkpoints carry along.

lr_schedule=torch: any torch.optim.lr_scheduler class by _target_ (lr_schedule.scheduler; built partial, the
optimizer given), stepped once per optimizer step, so that each step trains with the lr torch's scheduler gives it
after as many steps; its state goes into every checkpoint. ReduceLROnPlateau is stepped on trainer.objective at each
evaluation instead (every rank evaluates to the same value, so every rank takes the same decision). Two conveniences,
said in the docs: OneCycleLR's total_steps is the run's when the config gives neither it nor epochs; and a
scheduler's absolute lrs (max_lr, base_lr, min_lr) given as one number are scaled per group by its lr_scale."""
from __future__ import annotations

import inspect
import math

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from framework.config.components import build_component
from framework.config.optimizer import LrScheduleConfig
from framework.common.errors import ConfigError, on_one_line

KEY = "lr_schedule.scheduler"
_PER_GROUP_LRS = ("max_lr", "base_lr", "min_lr")  # absolute lrs a scheduler takes per group (a list) or for all


class LrSchedule:
    """The built-in schedules: a factor of each group's initial_lr per step."""

    def __init__(self, options: LrScheduleConfig, total_steps: int):
        self.name = options.name
        self.total_steps = max(int(total_steps), 1)
        self.warmup_fraction = options.warmup_fraction
        self.start_factor = options.start_factor
        self.final_factor = options.final_factor

    def factor(self, step: int) -> float:
        """Multiplier of the configured lr for optimizer step `step` (1-based)."""
        if self.name == "constant":
            return 1.0
        progress = (step - 1) / self.total_steps
        if progress < self.warmup_fraction:
            return self.start_factor + (1.0 - self.start_factor) * progress / self.warmup_fraction
        decay = (progress - self.warmup_fraction) / (1.0 - self.warmup_fraction)
        return self.final_factor + (1.0 - self.final_factor) * 0.5 * (1.0 + math.cos(math.pi * decay))

    def attach(self, optimizer) -> None:
        """Remember each group's configured lr; before a checkpoint is restored, which brings its own."""
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])

    def apply(self, optimizer, step: int) -> None:
        """Before optimizer step `step`: each group's lr for it."""
        if self.name == "constant":
            return
        factor = self.factor(step)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor

    def evaluated(self, value: float) -> None:
        """An evaluation gave trainer.objective `value` (the built-in schedules do not read it)."""

    def state_dict(self) -> dict | None:
        return None  # a function of the step alone

    def load_state_dict(self, state: dict | None) -> None:
        pass


class TorchSchedule:
    """One of torch's schedulers on the torch optimizer; apply(step) brings it to the lr of optimizer step `step`."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.on_evaluation = isinstance(scheduler, ReduceLROnPlateau)

    def attach(self, optimizer) -> None:
        pass  # the scheduler set each group's initial_lr when it was built

    def apply(self, optimizer, step: int) -> None:
        """Before optimizer step `step`: the scheduler stepped step - 1 times in all (once per optimizer step, after
        it, as torch's loops do), so the lr of every group is the one torch gives that step."""
        if self.on_evaluation:
            return
        while self.scheduler.last_epoch < step - 1:
            self.scheduler.step()

    def evaluated(self, value: float) -> None:
        if self.on_evaluation and math.isfinite(value):
            self.scheduler.step(value)

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        """The scheduler's state from a checkpoint, and every group's lr from it (whatever an engine's optimizer
        checkpoint restored), so the curve continues where it was."""
        if state is None:
            raise RuntimeError(f"the checkpoint holds no state of {type(self.scheduler).__name__}: it was written "
                               "with another lr_schedule (the driver compares them before resuming)")
        self.scheduler.load_state_dict(state)
        for group, lr in zip(self.scheduler.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr


def torch_optimizer(optimizer) -> torch.optim.Optimizer:
    """The torch optimizer an engine's optimizer is or wraps (DeepSpeed's ZeRO optimizers hold it as .optimizer and
    share its param_groups); torch's schedulers take only a torch.optim.Optimizer."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        return inner
    raise TypeError(f"{type(optimizer).__name__} is not a torch optimizer and wraps none (.optimizer)")


def build_lr_schedule(options: LrScheduleConfig, optimizer, total_steps: int | None, higher_is_better: bool = False):
    """The run's schedule on the engine's optimizer, for a run of total_steps optimizer steps (None: unknown, a stream
    without trainer.max_steps); higher_is_better: of trainer.objective (ReduceLROnPlateau's mode). ConfigError, naming
    the key, for a scheduler torch refuses."""
    if options.name != "torch":
        schedule = LrSchedule(options, total_steps or 1)  # unknown: the driver allowed only constant
        schedule.attach(optimizer)
        return schedule
    return TorchSchedule(build_scheduler(options.scheduler, torch_optimizer(optimizer), total_steps, higher_is_better))


def build_scheduler(node: dict, optimizer: torch.optim.Optimizer, total_steps: int | None, higher_is_better: bool):
    target = node["_target_"]
    make = build_component({**node, "_partial_": True}, KEY)
    cls = make.func if hasattr(make, "func") else make
    if not (isinstance(cls, type) and issubclass(cls, (LRScheduler, ReduceLROnPlateau))):
        raise ConfigError(f"{KEY}._target_={target} is not allowed: it is not a torch.optim.lr_scheduler class "
                          "(LRScheduler or ReduceLROnPlateau)")
    given = dict(make.keywords) if hasattr(make, "keywords") else {}
    extra = _run_facts(cls, given, optimizer, total_steps, higher_is_better)
    try:
        return make(optimizer, **extra)
    except Exception as exc:  # the scheduler's own refusal, whatever its type
        shown = ", ".join(f"{KEY}.{k}={v}" for k, v in given.items()) or "no arguments"
        unknown_length = ("; this run's length is unknown (a stream): give trainer.max_steps, or "
                          f"{KEY}.total_steps" if not total_steps and _takes_the_runs_length(cls, given) else "")
        raise ConfigError(f"{KEY}._target_={target} refused its arguments ({shown}): {type(exc).__name__}: "
                          f"{on_one_line(exc)}{unknown_length}") from None


def _takes_the_runs_length(cls: type, given: dict) -> bool:
    """The scheduler takes total_steps (OneCycleLR) and the config gives neither it nor epochs: the run's steps."""
    return ("total_steps" in inspect.signature(cls).parameters and given.get("total_steps") is None
            and given.get("epochs") is None)


def _run_facts(cls: type, given: dict, optimizer: torch.optim.Optimizer, total_steps: int | None,
               higher_is_better: bool) -> dict:
    """What the run adds to the scheduler's arguments: OneCycleLR's total_steps (the run's optimizer steps, where the
    run knows them) unless the config gives it or epochs; ReduceLROnPlateau's mode from trainer.objective unless
    given (a contradicting one is refused); a single absolute lr (max_lr, base_lr, min_lr) as one per group, x the
    group's lr_scale."""
    parameters = inspect.signature(cls).parameters
    extra = {}
    if total_steps and _takes_the_runs_length(cls, given):
        extra["total_steps"] = int(total_steps)
    if issubclass(cls, ReduceLROnPlateau):
        wanted = "max" if higher_is_better else "min"
        if "mode" not in given:
            extra["mode"] = wanted
        elif given["mode"] != wanted:
            raise ConfigError(f"{KEY}.mode={given['mode']} is not allowed: trainer.objective is "
                              f"{'higher' if higher_is_better else 'lower'}-is-better; use mode={wanted} (or leave "
                              "it out)")
    scales = [float(g.get("lr_scale", 1.0)) for g in optimizer.param_groups]
    for name in _PER_GROUP_LRS:
        value = given.get(name)
        if name in parameters and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and any(s != 1.0 for s in scales):
            extra[name] = [value * s for s in scales]
    return extra
