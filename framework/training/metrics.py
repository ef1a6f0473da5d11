"""Evaluation metrics and the training loss, both components (conf/metrics/*.yaml, conf/loss/*.yaml).

A metric is either a torchmetrics.Metric (update(outputs, targets) per batch, compute() at the end, synchronized
across ranks by its own reduction: MeanSquaredError, Perplexity, JaccardIndex, F1Score, ...) or any callable
metric(outputs, targets) -> the SUM over the batch of a per-sample score, which the evaluation adds up over every
batch and rank and divides by the samples (accuracy, top-k accuracy, error rate, ...). The loss is any callable
loss(outputs, targets) -> one value per sample, per element of a sample (a token, a pixel: averaged per sample over
the positions it scores, not those its ignore_index marks), or their mean (a scalar)."""
from __future__ import annotations

import sys

import torch
from torch import nn

from framework.config.components import build_component
from framework.config.rules import at_least, require
from framework.data.build import ClassIds
from framework.common.errors import ConfigError


class Accuracy:
    """Share of samples whose class id is among the top_k highest scores (top_k=1: plain accuracy). Outputs
    [B, C, ...] and ids [B, ...]: with more than one id per sample (a mask, a token sequence), each sample scores its
    share right of the positions not labelled ignore_index (padding; torch's cross-entropy ignores -100 alike)."""

    expects_class_ids = True
    higher_is_better = True

    def __init__(self, top_k: int = 1, ignore_index: int | None = -100):
        self.top_k = require("metrics: top_k", top_k, at_least(1))
        self.ignore_index = ignore_index

    def check(self, num_classes: int | None, key: str) -> None:
        if num_classes is not None and self.top_k > num_classes:
            raise ConfigError(f"{key}.top_k={self.top_k} is not allowed: the dataset has {num_classes} classes")

    def __call__(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.top_k == 1:
            right = outputs.argmax(1) == labels
        else:
            right = (outputs.topk(self.top_k, dim=1).indices == labels.unsqueeze(1)).any(1)
        scored = labels != self.ignore_index if self.ignore_index is not None else None
        return masked_mean(right.float(), len(labels), scored).sum()


def is_torchmetric(metric) -> bool:
    # A torchmetrics object exists only once its package was imported: never import it here (2 s per process).
    module = sys.modules.get("torchmetrics")
    return module is not None and isinstance(metric, module.Metric)


def build_metrics(nodes: dict) -> dict:
    """name -> metric, from the `metrics` node (a mapping of names to components)."""
    metrics = {}
    for name, node in (nodes or {}).items():
        metric = build_component(node, f"metrics.{name}")
        if not (callable(metric) or is_torchmetric(metric)):
            raise ConfigError(f"metrics.{name}._target_={node['_target_']} is not allowed: it built a "
                              f"{type(metric).__name__}, which is neither a torchmetrics.Metric nor callable as "
                              "metric(outputs, targets)")
        metrics[str(name)] = metric
    return metrics


def check_metrics(metrics: dict, num_classes: int | None) -> None:
    """Each metric that can check itself against the dataset's class count does (top_k > classes, ...)."""
    for name, metric in metrics.items():
        if hasattr(metric, "check"):
            metric.check(num_classes, f"metrics.{name}")


def build_loss(node):
    loss = build_component(node, "loss")
    if not callable(loss):
        raise ConfigError(f"loss._target_={node['_target_']} is not allowed: it built a {type(loss).__name__}, "
                          "which cannot be called as loss(outputs, targets)")
    return loss


def class_ids_of(loss, metrics: dict) -> ClassIds:
    """Whether the loss or a metric takes class ids (torch's cross-entropy and NLL losses, the Accuracy metric, any
    component that says `expects_class_ids = True`), and the id the loss ignores."""
    takes = isinstance(loss, (nn.CrossEntropyLoss, nn.NLLLoss)) or getattr(loss, "expects_class_ids", False)
    takes = takes or any(getattr(m, "expects_class_ids", False) for m in metrics.values())
    return ClassIds(bool(takes), getattr(loss, "ignore_index", None))


def higher_is_better(metric) -> bool:
    """Whether a larger value of this metric is better (torchmetrics' own attribute; a plain metric may say it, and
    is taken as a score otherwise)."""
    value = getattr(metric, "higher_is_better", None)
    return True if value is None else bool(value)


def per_sample_losses(value: torch.Tensor, samples: int, scored: torch.Tensor | None = None) -> torch.Tensor:
    """One loss per sample from what a loss returned: per sample [B], per element of each sample [B, ...] (tokens,
    pixels: their mean, over the positions `scored` marks where given), or one number for the batch (given to every
    sample)."""
    if value.dim() == 0:
        return value.expand(samples)
    if value.shape[0] != samples:
        raise ValueError(f"the loss returned shape {list(value.shape)} for a batch of {samples}; a loss returns one "
                         "value per sample (reduction='none'), per element of each sample, or their mean")
    return masked_mean(value, samples, scored) if value.dim() > 1 else value


def masked_mean(value: torch.Tensor, samples: int, scored: torch.Tensor | None) -> torch.Tensor:
    """Each sample's mean over its elements, or over those `scored` marks (a sample with none scores 0)."""
    value = value.reshape(samples, -1)
    if scored is None:
        return value.mean(1)
    scored = scored.reshape(samples, -1)
    return (value * scored).sum(1) / scored.sum(1).clamp(min=1)


def scored_positions(loss, targets, value: torch.Tensor) -> torch.Tensor | None:
    """Which elements a per-element loss scores: targets != its ignore_index (torch's cross-entropy and NLL losses,
    SequenceCrossEntropy, any loss with an ignore_index) when targets are class ids shaped like the loss; else
    None (every element counts)."""
    ignore = getattr(loss, "ignore_index", None)
    if ignore is None or not torch.is_tensor(targets) or targets.is_floating_point() or value.dim() < 2 \
            or targets.shape != value.shape:
        return None
    return targets != ignore


def sync_torchmetric(metric, device: torch.device, world_size: int, gather_objects) -> None:
    """Where torch.distributed is the backend (ddp, fsdp, deepspeed, eval.py under them), torchmetrics synchronizes
    by itself (gather_all_tensors: tensor collectives, uneven shapes padded). Elsewhere (Horovod) its states travel
    through the group's object gather: pickled CUDA tensors would come back on the sender's GPU, so CPU copies go
    and every rank's come back on the metric's device."""
    metric.to(device)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return

    def gather(tensor: torch.Tensor, group=None) -> list[torch.Tensor]:
        return [t.to(device) for t in gather_objects(tensor.detach().cpu())]

    metric.dist_sync_fn = gather
    metric.distributed_available_fn = lambda: world_size > 1


class EvalMetrics:
    """One evaluation's metrics: plain ones summed per sample on the device (and all-reduced once), torchmetrics
    updated per batch and computed at the end, synchronized over every rank (sync_torchmetric)."""

    def __init__(self, metrics: dict, group):
        self.metrics, self.group = metrics, group
        self.plain = [name for name, m in metrics.items() if not is_torchmetric(m)]
        for metric in metrics.values():
            if is_torchmetric(metric):
                sync_torchmetric(metric, group.device, group.world_size, group.gather_objects)
        # count, loss sum, then each plain metric's sum of per-sample scores
        self.sums = torch.zeros(2 + len(self.plain), device=group.device, dtype=torch.float64)
        self.reset()  # the same torchmetrics objects serve every evaluation of the run

    def reset(self) -> None:
        self.sums.zero_()
        for metric in self.metrics.values():
            if is_torchmetric(metric):
                metric.reset()

    def update(self, losses: torch.Tensor, outputs, targets) -> None:
        self.sums[0] += len(losses)
        self.sums[1] += losses.sum()
        for j, name in enumerate(self.plain):
            self.sums[2 + j] += self.metrics[name](outputs, targets)
        for metric in self.metrics.values():
            if is_torchmetric(metric):
                metric.update(outputs, targets)

    def compute(self) -> tuple[float, dict[str, float]]:
        """Every rank calls it (it reduces); (mean loss, name -> value) are the whole split's on every rank."""
        count, loss_sum, *plain_sums = self.group.all_reduce_sum(self.sums).tolist()
        count = max(count, 1)
        values = dict(zip(self.plain, (s / count for s in plain_sums)))
        for name, metric in self.metrics.items():
            if is_torchmetric(metric):
                values[name] = float(metric.compute())
        return loss_sum / count, {name: values[name] for name in self.metrics}
