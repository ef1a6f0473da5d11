"""verify.py's own keys (conf/verify.yaml's `verify:` node; everything else is train.py's config): how many steps the
two runs train, and how close they must be to count as equal."""
from __future__ import annotations

from dataclasses import dataclass

from framework.config.rules import Checked, above, at_least, rule


@dataclass
class VerifyConfig(Checked):
    steps: int = rule(20, at_least(1))  # optimizer steps each run trains (trainer.max_steps of both)
    # the largest difference that counts as equal: the loss of a step, relative to one process's; each weight tensor
    # at the end, the norm of the difference relative to one process's tensor's norm. fp32 with 2 workers differs by
    # the order of float sums: about 1e-7 in the loss and 1e-6 in the weights after 20 steps (LeNet, measured)
    loss_tolerance: float = rule(1e-5, above(0))
    weight_tolerance: float = rule(1e-4, above(0))
