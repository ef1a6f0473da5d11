"""The entry of a component group that has no keys of its own (conf/model/custom.yaml, conf/loss/custom.yaml,
conf/step/custom.yaml): the user names the class on the command line, `model=custom model._target_=mypkg.Net`, and
its arguments beside it. Open, so an argument needs no `+` (`model.hidden=64`); a built-in entry's keys are not
there to be merged with (cross_entropy's label_smoothing under a loss that does not take it)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from framework.common.paths import CONF_DIR

CUSTOM = "custom"  # the option's name in each group that has one


@dataclass
class CustomComponent:
    _target_: Optional[str] = None  # the class or function to build, e.g. torch.nn.NLLLoss


_NOT_THERE = re.compile(r"Could not delete from config\. '([\w.]+)' does not exist\.")


def deletion_hint(hydra_said: str) -> str:
    """What to add to Hydra's refusal of `~group.key`: Hydra says a key whose value is null "does not exist" too
    (`~dataset.root`), and the way to a component without the chosen entry's keys is its group's custom entry."""
    match = _NOT_THERE.search(hydra_said)
    group = match.group(1).split(".")[0] if match and "." in match.group(1) else None
    if group is None or not (CONF_DIR / group / f"{CUSTOM}.yaml").is_file():
        return ""
    return (f" (Hydra says that of a key whose value is null too; a {group} with none of the chosen entry's keys "
            f"starts from {group}={CUSTOM}: docs/your-own-code.md)")
