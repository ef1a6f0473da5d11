"""The step: how a batch becomes outputs and a loss. A component (conf/step/*.yaml), replaceable by `_target_`
for experiments the default does not fit (contrastive pairs, masked language modelling, a model that takes its
input's parts as keyword arguments). The loop runs it under the run's autocast, for training (then backward) and
for evaluation (then the metrics, on its outputs and targets).

A step is called as step(model, batch, loss) with batch = (inputs, targets) as the dataset gave them (tensors or
any nesting of them, on the device) and returns a StepOutput: the loss value (one per sample, per element of a
sample, or the batch's mean: framework/training/metrics.py: per_sample_losses), the outputs and the targets the
metrics score, and the number of samples."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from framework.data.batches import batch_size, float_outputs


@dataclass
class StepOutput:
    loss: torch.Tensor
    outputs: Any
    targets: Any
    samples: int


class Supervised:
    """The default: outputs = model(inputs) (a nesting of inputs is passed as it is, as one argument), and
    loss(outputs, targets) with floating-point outputs in fp32."""

    def __call__(self, model, batch, loss) -> StepOutput:
        inputs, targets = batch
        outputs = float_outputs(model(inputs))
        return StepOutput(loss(outputs, targets), outputs, targets, batch_size(targets, inputs))
