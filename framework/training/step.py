"""The step: how a batch becomes outputs and a loss. A component (conf/step/*.yaml), replaceable by `_target_`
for experiments the default does not fit (contrastive pairs, masked language modelling, a model that takes its
input's parts as keyword arguments). The loop runs it under the run's autocast, for training (then backward) and
for evaluation (then the metrics, on its outputs and targets).

A step is called as step(model, batch, loss) with batch = (inputs, targets) as the dataset (or its collate_fn) gave
them (tensors or any nesting of them, on the device), or the batch as it is when samples are inputs only (a step of
the user's own: an autoencoder's, a self-supervised one), and returns a StepOutput: the loss value (one per sample,
per element of a sample, or the batch's mean: framework/training/metrics.py: per_sample_losses), the outputs and the
targets the metrics score, and the number of samples."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from framework.data.batches import batch_size, describe, float_outputs, leaves
from framework.data.build import is_pair
from framework.common.errors import ConfigError
from framework.training.metrics import per_sample_losses, scored_positions


@dataclass
class StepOutput:
    loss: torch.Tensor
    outputs: Any
    targets: Any
    samples: int
    tokens: Any = None  # the batch's tokens (a number, or a tensor on the device), where the step says what one is:
    # throughput/tokens_per_sec in TensorBoard; None: samples only


class Supervised:
    """The default: outputs = model(inputs) (a nesting of inputs is passed as it is, as one argument), and
    loss(outputs, targets) with floating-point outputs in fp32; a loss per element (token, pixel) is averaged per
    sample over the positions the loss scores (not those it ignores: ignore_index)."""

    needs_targets = True  # data without targets is refused in the driver (framework/assemble.py)

    def __init__(self, count_tokens: bool = False):
        self.count_tokens = count_tokens  # a token is a target element the loss scores (not its ignore_index)

    def __call__(self, model, batch, loss) -> StepOutput:
        if not is_pair(batch):
            raise ValueError(f"{type(self).__name__} takes batches of (inputs, targets), not "
                             f"{describe(batch, 'batch')}")
        inputs, targets = batch
        outputs = float_outputs(logits_of(model(inputs)))
        samples = batch_size(targets, inputs)
        value = loss(outputs, targets)
        scored = scored_positions(loss, targets, value)
        tokens = None
        if self.count_tokens:
            tokens = scored.sum() if scored is not None else sum(t.numel() for t in leaves(targets))
        return StepOutput(per_sample_losses(value, samples, scored), outputs, targets, samples, tokens)


def logits_of(outputs):
    """What the standard losses and metrics score of a model's outputs: the `logits` of a dict or a HuggingFace
    ModelOutput (its other keys are there for a step of the user's own); any other output as it is."""
    if isinstance(outputs, Mapping) and "logits" in outputs:
        return outputs["logits"]
    return outputs


def _field(outputs, name: str):
    return outputs.get(name) if isinstance(outputs, Mapping) else getattr(outputs, name, None)


class ModelLoss:
    """step=model_loss, the HuggingFace convention for a model that computes its own loss: the batch (a dict) goes
    in as keyword arguments, the loss is the output's `loss` (its mean over the batch), and the metrics score the
    output's `logits` against the batch's `labels` (the key `labels` names). The loss group is not used."""

    needs_targets = False  # the batch is the model's keyword arguments, labels among them

    def __init__(self, labels: str = "labels"):
        self.labels = labels

    def __call__(self, model, batch, loss) -> StepOutput:
        if not isinstance(batch, Mapping):
            raise ConfigError(f"step=model_loss is not allowed for these batches ({describe(batch, 'batch')}): it "
                              "passes a batch to the model as keyword arguments, so samples must be dicts (e.g. a "
                              "HuggingFace dataset's rows: input_ids, attention_mask, labels); use step=supervised "
                              "for (input, target) pairs")
        outputs = model(**batch)
        value = _field(outputs, "loss")
        if not torch.is_tensor(value):
            found = (f"keys {', '.join(map(str, outputs))}" if isinstance(outputs, Mapping)
                     else describe(outputs, "output"))
            raise ConfigError(f"step=model_loss is not allowed for {type(model).__name__}: its output has no loss "
                              f"({found}); it needs a model that computes its own loss and returns it as `loss` "
                              f"(HuggingFace models do when the batch has `{self.labels}`), or use step=supervised "
                              "with a loss")
        samples = batch_size(batch)
        logits = _field(outputs, "logits")
        return StepOutput(per_sample_losses(value.float(), samples), float_outputs(logits),
                          batch.get(self.labels), samples)
