"""sample.py's schema (conf/sample.yaml): which trained model, what to start from and how to draw the tokens."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from framework.config.choices import Accelerator, Choice
from framework.config.rules import Checked, SettingError, above, at_least, rule
from framework.config.targets import patterns_of


class WeightsFile(Choice):
    best = "best"  # weights/best.pt (the best evaluation), else weights/last.pt
    last = "last"  # weights/last.pt (the end of the run)


@dataclass(kw_only=True)
class SampleConfig(Checked):
    ckpt_path: str = "???"  # a run folder or a weights file (weights/*.pt)
    weights: WeightsFile = WeightsFile.best  # which file of a run folder's weights/
    prompt: str = "\n"  # the text the samples continue
    prompt_file: Optional[str] = None  # or a UTF-8 file's text (instead of prompt)
    max_new_tokens: int = rule(500, at_least(1))
    temperature: float = rule(0.8, above(0))  # < 1: likelier tokens; > 1: more varied
    top_k: Optional[int] = rule(200, at_least(1))  # draw among the k likeliest tokens only (null: all)
    num_samples: int = rule(1, at_least(1))
    seed: int = rule(1337, at_least(0))
    accelerator: Accelerator = Accelerator.auto  # auto: the GPU when there is one
    # module patterns (mypkg.*) whose classes the run's model config may name, besides the built-in ones: a run
    # folder is data, not code (framework/config/targets.py)
    allowed_targets: List[str] = field(default_factory=list)

    def check(self) -> None:
        patterns_of(self.allowed_targets)  # one line naming the pattern that is not one
        if self.prompt_file is not None and self.prompt != "\n":
            raise SettingError("prompt_file", self.prompt_file, message="prompt_file is not allowed beside prompt: "
                               "give one of them")
