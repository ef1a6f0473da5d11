"""Losses and metrics for sequences (experiment=char_lm) that torch's own do not cover as a per-sample component."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from framework.training.metrics import masked_mean


class SequenceCrossEntropy:
    """Next-token cross-entropy: logits [B, T, V], token ids [B, T] -> one loss per token [B, T] (the loop averages
    them per sample)."""

    expects_class_ids = True

    def __init__(self, ignore_index: int = -100):
        self.ignore_index = ignore_index

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return per_token_nats(logits, targets, self.ignore_index)


class BitsPerToken:
    """Bits per character (per token) of a language model: its mean cross-entropy per token in bits; each sample
    scores its own mean over the tokens not labelled ignore_index, summed over the batch as plain metrics are."""

    higher_is_better = False

    def __init__(self, ignore_index: int = -100):
        self.ignore_index = ignore_index

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        nats = per_token_nats(logits, targets, self.ignore_index)
        return masked_mean(nats, len(targets), targets != self.ignore_index).sum() / math.log(2)


def per_token_nats(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Cross-entropy per token, shaped like targets. Over [B*T, V] rows: the vocabulary contiguous, as log_softmax
    wants it (not over logits.transpose(1, 2), a strided class dimension)."""
    flat = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index,
                           reduction="none")
    return flat.view(targets.shape)
