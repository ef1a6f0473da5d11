"""The first N steps of a run as the whole run would train them: ends the run at the evaluation of step N (with
trainer.eval_every_n_steps=N), where trainer.max_steps=N would have made N the run's length, and so shortened its
learning-rate schedule (a warm-up over 10% of the run would end after N/10 steps). verify.py's runs use it
(framework/verify/runs.py)."""
from __future__ import annotations

from framework.callbacks.base import Callback
from framework.config.rules import at_least, require


class StopAfter(Callback):
    def __init__(self, step: int):
        self.step = require("callbacks.stop_after.step", step, at_least(1))

    def on_evaluation_end(self, state, step: int, result) -> None:
        if step >= self.step:  # the same step on every rank: every rank stops
            state.request_stop(f"the first {self.step} steps are done")
