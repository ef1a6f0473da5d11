"""Marks of tests that need GPUs (select them with -m gpu; skipped where fewer are visible)."""
from __future__ import annotations

import pytest
import torch


def needs_gpus(count: int = 1):
    """Marks a test `gpu` and skips it where fewer than `count` CUDA GPUs are visible."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0

    def mark(test):
        test = pytest.mark.gpu(test)
        return pytest.mark.skipif(have < count, reason=f"needs {count} CUDA GPU(s), {have} visible")(test)

    return mark


needs_gpu = needs_gpus(1)
