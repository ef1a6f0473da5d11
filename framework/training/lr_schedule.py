"""Learning-rate schedules (conf/lr_schedule/*.yaml) as a factor of each param group's configured lr.

The factor is a pure function of the optimizer step, so a resumed run continues the same curve from its
checkpointed step and nothing extra is saved. The configured lr stays in each param group as
`initial_lr` (torch's own schedulers use the same key), which checkpoints carry along."""
from __future__ import annotations

import math

from framework.config.optimizer import LrScheduleConfig

class LrSchedule:
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
        if self.name == "constant":
            return
        factor = self.factor(step)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor
