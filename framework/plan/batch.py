"""The batch the planned steps run on: the training split's first samples, prepared as the loop gets them
(normalized, on the CPU), made fake and taken again and again up to the micro-batch: a micro-batch of any size,
without reading or holding that many samples (only its shapes and dtypes matter). Data whose samples differ in size
(padded by a collate_fn) is planned at the sizes of its first samples."""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from framework.data.batches import batch_size, take
from framework.data.build import Data
from framework.data.loaders import first_batch
from framework.plan.fake import fake_batch

SAMPLES_READ = 64


def planned_batch(data: Data, size: int, mode: FakeTensorMode | None):
    """A batch of `size` samples: the first ones, taken in turn; fake in `mode` (None: real, for a row traced on
    real tensors)."""
    batch = first_batch(data, min(size, SAMPLES_READ))
    read = batch_size(batch)
    if mode is None:
        return take(batch, torch.arange(size) % read)
    batch = fake_batch(batch, mode)
    with mode:
        return take(batch, torch.arange(size) % read)

