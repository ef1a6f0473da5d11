"""Two training steps as the loop takes them (framework/training/trainer.py: Trainer._train_step): gradients
dropped, forward and backward of each micro-batch under the engine's precision, the optimizer's step with the run's
clipping; counted by LiveBytes from the second step on, when the first step's optimizer state is alive."""
from __future__ import annotations

from framework.plan.tracer import BATCH, LiveBytes
from framework.training.engine import Weighting, Wrapped, forward_backward, gradient_sync


def counted_steps(wrapped: Wrapped, step, loss, batch, options, live: LiveBytes) -> None:
    """`options`: the trainer's (grad_accum micro-batches of `batch` a step, grad_clip). The learning-rate schedule
    and the non-finite check are left out: they hold no tensor, and the check reads a value, which a fake tensor has
    not."""
    k = options.grad_accum
    live.track(wrapped.model, wrapped.optimizer)
    live.label(batch, BATCH)
    for index in range(2):
        wrapped.optimizer.zero_grad(set_to_none=True)
        for micro in range(k):
            with gradient_sync(wrapped, on=micro == k - 1):
                forward_backward(wrapped, step, batch, loss, Weighting(k))
        wrapped.precision.optimizer_step(wrapped.model, wrapped.optimizer, options.grad_clip, False)
        live.label_optimizer(wrapped.optimizer)
        if index == 0:
            live.reset_peak()
