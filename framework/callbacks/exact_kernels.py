"""What verify.py (framework/verify/causes.py) switches off in both runs on GPUs to see whether a gap is the GPU's own
choice of kernels: TF32 (cuDNN's convolutions run it by default, so two fp32 runs that split a batch otherwise round
otherwise from step 1 on Ampere and later), cuDNN's timed choice of algorithms per shape (a rank's micro-batch and
one process's batch get other ones) and its non-deterministic algorithms. On the CPU it changes nothing."""
from __future__ import annotations

import torch

from framework.callbacks.base import Callback
from framework.training.determinism import deterministic_cudnn


class ExactKernels(Callback):
    def on_fit_start(self, state) -> None:
        if state.device.type != "cuda":
            return
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        deterministic_cudnn()
