"""`trainer.deterministic` (false | true | warn): the same run twice gives the same bits, as Lightning's
`deterministic=True`, Accelerate's `set_seed(deterministic=True)` and torchtitan's `debug.deterministic` do.

true sets, in every process that trains or evaluates, before its model is built:
- torch.use_deterministic_algorithms(True): an op with no deterministic kernel raises (warn: only warns);
- cuDNN deterministic and untimed (benchmark off): the flags framework/callbacks/exact_kernels.py shares;
- CUBLAS_WORKSPACE_CONFIG=:4096:8 in the process's environment before CUDA starts (cuBLAS reads it when it makes its
  first handle; without it torch's deterministic mode refuses cuBLAS matmuls on CUDA >= 10.2).
The DataLoader's worker seeds are the run's and the rank's whatever this says (framework/data/augment.py)."""
from __future__ import annotations

import os
from typing import NoReturn

import torch

KEY = "trainer.deterministic"
CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")  # the two workspace sizes NVIDIA documents as deterministic
# what torch says when an op has no deterministic kernel, or cuBLAS has no deterministic workspace
TORCH_REFUSAL = "use_deterministic_algorithms"


def deterministic_cudnn() -> None:
    """cuDNN's deterministic algorithms, chosen without timing them per shape (benchmark off)."""
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def deterministic_environment(setting) -> None:
    """CUBLAS_WORKSPACE_CONFIG for a deterministic run, in this process's environment: called where a process that
    trains starts, before anything touches CUDA. A value the user set is kept (preflight refuses one that is not
    deterministic)."""
    if setting and os.environ.get(CUBLAS_WORKSPACE) not in CUBLAS_DETERMINISTIC:
        os.environ[CUBLAS_WORKSPACE] = CUBLAS_DETERMINISTIC[0]


def apply_determinism(setting) -> None:
    """torch's deterministic mode and cuDNN's flags for this process, before the model is built; false puts torch's
    defaults back (a sweep runs its single-process jobs one after another in one process)."""
    deterministic_environment(setting)
    torch.use_deterministic_algorithms(bool(setting), warn_only=setting == "warn")
    if setting:
        deterministic_cudnn()
    else:
        torch.backends.cudnn.deterministic = False


def environment_refusal(setting, environ=os.environ) -> str | None:
    """The line that refuses a CUBLAS_WORKSPACE_CONFIG of the user's that cuBLAS is not deterministic with."""
    value = environ.get(CUBLAS_WORKSPACE)
    if setting and value is not None and value not in CUBLAS_DETERMINISTIC:
        return (f"{KEY}={str(setting).lower()} is not allowed with {CUBLAS_WORKSPACE}={value} (the environment): "
                f"cuBLAS is deterministic only with {' or '.join(CUBLAS_DETERMINISTIC)}; unset it or use one of them")
    return None


def callback_refusal(setting, callback) -> str | None:
    """Why a callback cannot run in a deterministic run (its class's `undoes_determinism`: it turns on what the
    switch turns off), or None."""
    why = getattr(callback, "undoes_determinism", None)
    if setting and why:
        return f"is not allowed with {KEY}={str(setting).lower()}: {why}; drop the callback or set {KEY}=false"
    return None


class NoDeterministicKernel(RuntimeError):
    """An op without a deterministic kernel under trainer.deterministic=true: torch's message and the key's line."""


def raise_explained(exc: BaseException, setting) -> NoReturn:
    """Raise torch's refusal of a non-deterministic op again with one line naming the key that asked for it; any
    other exception as it is (call it in an except block that caught exc)."""
    if setting is True and isinstance(exc, RuntimeError) and TORCH_REFUSAL in str(exc):
        raise NoDeterministicKernel(f"{exc}\nraised by {KEY}=true; set {KEY}=warn to only warn, or false") from exc
    raise exc
