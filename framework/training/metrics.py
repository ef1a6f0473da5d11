"""Evaluation metrics and the training loss, both components (conf/metrics/*.yaml, conf/loss/*.yaml).

A metric is any callable metric(logits, labels) -> the SUM over the batch of a per-sample score; the evaluation
adds the sums of every batch and rank and reports sum / samples (accuracy, top-k accuracy, error rate, ...).
The loss is any callable loss(logits, labels) -> per-sample losses (shape [batch]) or their mean (a scalar)."""
from __future__ import annotations

import torch

from framework.config.components import build_component
from framework.config.rules import at_least, require
from framework.errors import ConfigError


class Accuracy:
    """Share of samples whose label is among the top_k highest logits (top_k=1: plain accuracy)."""

    def __init__(self, top_k: int = 1):
        self.top_k = require("metrics: top_k", top_k, at_least(1))

    def check(self, num_classes: int, key: str) -> None:
        if self.top_k > num_classes:
            raise ConfigError(f"{key}.top_k={self.top_k} is not allowed: the dataset has {num_classes} classes")

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.top_k == 1:
            return (logits.argmax(1) == labels).sum()
        return (logits.topk(self.top_k, dim=1).indices == labels.unsqueeze(1)).any(1).sum()


def build_metrics(nodes: dict, num_classes: int) -> dict:
    """name -> metric, from the `metrics` node (a mapping of names to components)."""
    metrics = {}
    for name, node in (nodes or {}).items():
        metric = build_component(node, f"metrics.{name}")
        if not callable(metric):
            raise ConfigError(f"metrics.{name}._target_={node['_target_']} is not allowed: it built a "
                              f"{type(metric).__name__}, which cannot be called as metric(logits, labels)")
        if hasattr(metric, "check"):
            metric.check(num_classes, f"metrics.{name}")
        metrics[str(name)] = metric
    return metrics


def build_loss(node):
    loss = build_component(node, "loss")
    if not callable(loss):
        raise ConfigError(f"loss._target_={node['_target_']} is not allowed: it built a {type(loss).__name__}, "
                          "which cannot be called as loss(logits, labels)")
    return loss


def per_sample_losses(loss, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss for each sample of the batch; a loss that returns only the batch mean gives it to every sample."""
    value = loss(logits, labels)
    return value.expand(len(labels)) if value.dim() == 0 else value
