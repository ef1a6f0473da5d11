"""The first samples of the training split as one batch, prepared as the loop gets them (normalized, on the CPU):
what the planned steps run on (only its shapes and dtypes matter)."""
from __future__ import annotations

import torch

from framework.data.batches import take
from framework.data.build import Data, first_samples
from framework.data.loaders import BatchPipeline, prepare, split_tensors


def first_batch(data: Data, size: int):
    collate = data.collate["train"]
    tensors = split_tensors(data.train, collate)
    if tensors is not None:
        rows = torch.arange(size)
        batch = (take(tensors[0], rows), take(tensors[1], rows))
    else:
        batch = collate.first_batch(first_samples(data.train, size), "train")
    return prepare(batch, BatchPipeline(data.normalization, data.in_shape, torch.device("cpu")), data.pairs)
