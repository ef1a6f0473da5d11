"""What a GPU holds beside the run's tensors, per GPU kind: the CUDA context, the cuBLAS workspace, NCCL's buffers
(with more than one rank) and the caching allocator's rounding and fragmentation (a fraction of the tensors' peak).
Every number here is an ESTIMATE from the libraries' documented defaults and public reports, not yet measured by
this project on a GPU (docs/plan.md says which is which); `measured` turns true per kind once a GPU run measures it
(`make test-gpu`'s plan cell)."""
from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 2 ** 20
CUBLAS_HANDLES = 2  # the loop's thread and autograd's backward thread (DeviceConstants.allocated_beside_tensors)


@dataclass(frozen=True, kw_only=True)
class DeviceConstants:
    kind: str
    cuda_context: int  # bytes: the driver's context and torch's kernels, loaded lazily (CUDA_MODULE_LOADING=LAZY)
    cublas_workspace: int  # bytes: torch's default workspace per handle (CUBLAS_WORKSPACE_CONFIG), one stream
    nccl: int  # bytes per rank in a world of more than one: NCCL's channel buffers (NCCL_BUFFSIZE x channels)
    rounding: float  # the caching allocator's block rounding and fragmentation, as a fraction of the tensors' peak
    measured: bool = False

    def allocated_beside_tensors(self) -> int:
        """What torch.cuda.max_memory_allocated counts beside the run's tensors: a cuBLAS workspace per handle, drawn
        from the caching allocator, and a training step has two handles, the loop's thread's (forward) and autograd's
        backward thread's. Measured on an H200 (torch 2.11, the char LM's GPT, step 2): 66.1 MiB above the traced
        peak, of which these are 64."""
        return CUBLAS_HANDLES * self.cublas_workspace

    def room(self, memory: int, workers: int) -> int:
        """Bytes of `memory` the run's tensors may take at their peak on one of `workers` ranks."""
        fixed = self.cuda_context + self.allocated_beside_tensors() + (self.nccl if workers > 1 else 0)
        return max(0, math.floor((memory - fixed) / (1 + self.rounding)))


# torch's cuBLAS workspace default: 4096 KiB x 2 + 16 KiB x 8 before Hopper, 4096 KiB x 8 from Hopper on (two of them
# seen in an H200's max_memory_allocated: allocated_beside_tensors)
_BEFORE_HOPPER = dict(cuda_context=400 * MIB, cublas_workspace=9 * MIB, nccl=256 * MIB, rounding=0.05)
_HOPPER_ON = dict(cuda_context=600 * MIB, cublas_workspace=32 * MIB, nccl=512 * MIB, rounding=0.05)
# by a word of the card's name: the plan's cards (framework/plan/gpus.py) and torch's device names
# ("NVIDIA H100 80GB HBM3") both hold it
KINDS = {
    "T4": DeviceConstants(kind="T4", **{**_BEFORE_HOPPER, "cuda_context": 300 * MIB}),
    "V100": DeviceConstants(kind="V100", **{**_BEFORE_HOPPER, "cuda_context": 300 * MIB}),
    "A10": DeviceConstants(kind="A10", **_BEFORE_HOPPER),
    "L4": DeviceConstants(kind="L4", **_BEFORE_HOPPER),
    "RTX3090": DeviceConstants(kind="RTX3090", **_BEFORE_HOPPER),
    "RTX4090": DeviceConstants(kind="RTX4090", **_BEFORE_HOPPER),
    "A100": DeviceConstants(kind="A100", **_BEFORE_HOPPER),
    "L40S": DeviceConstants(kind="L40S", **_BEFORE_HOPPER),
    "H100": DeviceConstants(kind="H100", **_HOPPER_ON),
    "H200": DeviceConstants(kind="H200", **_HOPPER_ON),
    "B200": DeviceConstants(kind="B200", **_HOPPER_ON),
    "MI300X": DeviceConstants(kind="MI300X", **{**_HOPPER_ON, "cuda_context": 800 * MIB}),  # HIP, RCCL
}
UNKNOWN = DeviceConstants(kind="another GPU", **_HOPPER_ON)  # the larger estimates: a fit it says is not optimistic


def constants_of(gpu_name: str) -> DeviceConstants:
    """The constants of the kind a card's name holds (`H100-80GB`, `NVIDIA H100 80GB HBM3`); UNKNOWN otherwise."""
    words = gpu_name.upper().replace("-", " ").split()
    words += [a + b for a, b in zip(words, words[1:])]  # "GeForce RTX 4090" holds RTX4090
    for kind, constants in KINDS.items():
        if kind in words:
            return constants
    return UNKNOWN
