"""The entry of a component group that has no keys of its own (conf/model/custom.yaml, conf/loss/custom.yaml,
conf/step/custom.yaml): the user names the class on the command line, `model=custom model._target_=mypkg.Net`, and
its arguments beside it. Open, so an argument needs no `+` (`model.hidden=64`); a built-in entry's keys are not
there to be merged with (cross_entropy's label_smoothing under a loss that does not take it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

CUSTOM = "custom"  # the option's name in each group that has one


@dataclass
class CustomComponent:
    _target_: Optional[str] = None  # the class or function to build, e.g. torch.nn.NLLLoss
