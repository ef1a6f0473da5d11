"""An exponential moving average of the weights (Lightning's WeightAveraging, Composer's EMA): after every optimizer
step, average = decay * average + (1 - decay) * weights, parameters and buffers alike (torch's AveragedModel with
its EMA update). The average travels in the checkpoints (a resumed run keeps it), is written to weights/ema.pt at
the end of training (what eval.py evaluates: ckpt_path=<run folder>/weights/ema.pt), and with evaluate_with_ema the
loop's evaluations (early stopping, the best checkpoint, TensorBoard) score the average instead of the weights.

Every rank keeps the same average of the same whole parameters (single, dp, ddp, horovod); an engine that shards
them (fsdp, DeepSpeed) is refused in the driver."""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from framework.callbacks.base import Callback
from framework.callbacks.best import write_run_weights
from framework.config.rules import between, one_of, require

EMA_WEIGHTS = "ema"


class EMA(Callback):
    def __init__(self, decay: float = 0.999, evaluate_with_ema: bool = False):
        self.decay = float(require("callbacks.ema.decay", decay, between(0, 1, high_open=True)))
        self.evaluate_with_ema = require("callbacks.ema.evaluate_with_ema", evaluate_with_ema,
                                         one_of(True, False, allowed="true or false"))
        self.average: AveragedModel | None = None
        self.saved: dict | None = None  # a resumed run's average, until the model is there to take it

    def refuses(self, sharded: bool) -> str | None:
        if sharded:
            return "it averages whole parameters on every rank, which this engine shards; use single, dp, ddp or horovod"
        return None

    def on_fit_start(self, state) -> None:
        module = state.model
        self.average = AveragedModel(module, multi_avg_fn=get_ema_multi_avg_fn(self.decay), use_buffers=True)
        if self.saved is not None:
            self.average.load_state_dict(self.saved)
            self.saved = None
        if self.evaluate_with_ema:
            state.evaluate_inside(lambda: self._swapped_in(module))

    def on_train_step_end(self, state, step: int) -> None:
        self.average.update_parameters(state.model)

    def on_fit_end(self, state) -> None:
        if state.is_main:
            weights = {k: v.detach().cpu() for k, v in self.average.module.state_dict().items()}
            write_run_weights(state, EMA_WEIGHTS, weights)

    @contextmanager
    def _swapped_in(self, module):
        """The average in the module's own tensors for an evaluation, its weights back afterwards (in place: every
        wrapper and the optimizer keep pointing at the same tensors)."""
        live, averaged = _tensors(module), _tensors(self.average.module)
        kept = [t.detach().clone() for t in live]
        with torch.no_grad():
            for t, a in zip(live, averaged):
                t.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for t, k in zip(live, kept):
                    t.copy_(k)

    def state_dict(self) -> dict | None:
        if self.average is None:
            return self.saved
        return {k: v.detach().cpu() for k, v in self.average.state_dict().items()}

    def load_state_dict(self, state: dict) -> None:
        self.saved = state


def _tensors(module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]
