"""One process's own rounding, measured (verify.py, framework/verify/): the one-process run trained once more with
this callback computes the same thing with its float sums in another order. On the CPU it runs another number of
threads (the kernels split their reductions by thread: BatchNorm's, the convolutions'); on a GPU cuDNN picks its
algorithms by timing them (torch.backends.cudnn.benchmark flipped) and matrix products go through the other BLAS
library (cuBLAS <-> cuBLASLt: torch.backends.cuda.preferred_blas_library), whose kernels split their sums otherwise
(the cuDNN flip alone changes nothing where the timed choice is the default one). The samples, the random draws and
the arithmetic are the same. How far this run drifts from the plain one is how far rounding alone takes this
configuration in as many steps: a model whose gradients cancel (BatchNorm's) or a large learning rate amplify it."""
from __future__ import annotations

import torch

from framework.callbacks.base import Callback


class OtherKernels(Callback):
    undoes_determinism = "it turns cuDNN's timed choice of algorithms (benchmark) on, on GPUs"

    def on_fit_start(self, state) -> None:
        if state.device.type == "cuda":
            torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
            blas = torch.backends.cuda.preferred_blas_library().name.lower()
            torch.backends.cuda.preferred_blas_library("cublas" if blas == "cublaslt" else "cublaslt")
        else:
            torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)
