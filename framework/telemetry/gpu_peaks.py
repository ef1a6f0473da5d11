"""Dense (no 2:4 sparsity) peak TFLOP/s of common data-centre GPUs per precision, for MFU.

NVIDIA's datasheets print Tensor Core figures "with sparsity"; the dense figure, the one a training run can reach,
is half of that. Sources (checked 2026-11):
  A100 (SXM4 and PCIe, 40/80 GB): A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4): FP32 19.5,
      TF32 156 (312 sparse), BF16/FP16 312 (624 sparse)
  H100 SXM5 and H100 PCIe: H100 datasheet / product brief PB-11133: SXM FP32 67, TF32 989*, BF16/FP16 1,979*;
      PCIe FP32 51, TF32 756*, BF16/FP16 1,513* (* with sparsity); Hopper whitepaper's dense SXM figures 494.7/989.4
  H200 (SXM): H200 datasheet: same compute as H100 SXM (FP32 67, TF32 989*, BF16/FP16 1,979*)
  L40S: L40S datasheet: FP32 91.6, TF32 183 (366*), BF16/FP16 362.05 (733*)
  B200 (HGX B200, per GPU): Blackwell datasheet: FP32 75, TF32 2.2 PF*, BF16/FP16 4.5 PF*
Variants whose figures differ and are not listed (H100/H200 NVL, GH200, B100, ...) are unknown: no MFU rather than
a wrong one.

A MIG slice ("NVIDIA H100 80GB HBM3 MIG 3g.40gb") has a share of the GPU's streaming multiprocessors, and its peak is
that share of the whole GPU's (same clocks, same Tensor Cores per SM): the table's peak x its SMs / the full GPU's
SMs (A100 108, H100 SXM 132, H100 PCIe 114, H200 132, B200 148: the datasheets' and whitepapers' SM counts). A slice
whose SM count is not known gets no MFU.
"""
from __future__ import annotations

import torch

# precision key -> dense TFLOP/s
_PEAKS = {
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "H100 SXM": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5},
    "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05},
    "B200": {"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0},
}
# streaming multiprocessors of the whole GPU, to scale a MIG slice's peak (L40S has no MIG)
_FULL_SMS = {"A100": 108, "H100 SXM": 132, "H100 PCIe": 114, "H200": 132, "B200": 148}
KNOWN = ", ".join(_PEAKS)


def is_mig(device_name: str) -> bool:
    return "MIG" in device_name.upper().split()


def gpu_model(device_name: str) -> str | None:
    """The table's row for torch.cuda.get_device_name() (e.g. 'NVIDIA H100 80GB HBM3' is the SXM part), or None."""
    name = device_name.upper().replace("-", " ")
    words = set(name.split())
    if "NVL" in words or "GH200" in words:
        return None
    if "A100" in words:
        return "A100"
    if "H100" in words:
        return "H100 PCIe" if "PCIE" in words else "H100 SXM"  # the SXM part reports "H100 80GB HBM3"
    if "H200" in words:
        return "H200"
    if "L40S" in words:
        return "L40S"
    if "B200" in words:
        return "B200"
    return None


def precision_key(trainer_precision: str, convolutions: bool = False) -> str:
    """What the math actually runs in: bf16/fp16 under autocast. fp32 runs on TF32 Tensor Cores where torch allows
    it: matmuls with allow_tf32 or a float32 matmul precision other than "highest"; convolutions with cuDNN's
    allow_tf32, which is on by default (so an fp32 CNN is measured against the TF32 peak, not the fp32 one)."""
    if trainer_precision in ("bf16", "fp16"):
        return trainer_precision
    matmul_tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    conv_tf32 = convolutions and torch.backends.cudnn.allow_tf32
    return "tf32" if matmul_tf32 or conv_tf32 else "fp32"


def peak_tflops(device_name: str, trainer_precision: str, convolutions: bool = False,
                sm_count: int | None = None) -> float | None:
    """Dense peak TFLOP/s of this device for the run's precision; a MIG slice's share by its `sm_count`
    (torch.cuda.get_device_properties(i).multi_processor_count). None: unknown, no MFU."""
    model = gpu_model(device_name)
    if model is None:
        return None
    peak = _PEAKS[model][precision_key(trainer_precision, convolutions)]
    if not is_mig(device_name):
        return peak
    full = _FULL_SMS.get(model)
    if not full or not sm_count or sm_count > full:
        return None
    return peak * sm_count / full
