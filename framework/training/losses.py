"""Losses and metrics for sequences (experiment=char_lm) that torch's own do not cover as a per-sample component."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class SequenceCrossEntropy:
    """Next-token cross-entropy: logits [B, T, V], token ids [B, T] -> one loss per token [B, T] (the loop averages
    them per sample)."""

    expects_class_ids = True

    def __init__(self, ignore_index: int = -100):
        self.ignore_index = ignore_index

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=self.ignore_index, reduction="none")


class BitsPerToken:
    """Bits per character (per token) of a language model: its mean cross-entropy per token in bits; each sample
    scores its own mean, summed over the batch as plain metrics are."""

    higher_is_better = False

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        nats = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        return nats.reshape(len(targets), -1).mean(1).sum() / math.log(2)
