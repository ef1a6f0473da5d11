"""GPU utilization and memory in use, from NVML (nvidia-ml-py: `pip install 'hydra-dist[nvml]'`).

Read through torch.cuda's own NVML helpers, so device i is torch's cuda:i whatever CUDA_VISIBLE_DEVICES
says. Without nvidia-ml-py, without a driver or without a GPU every reading is empty: callers show or log
nothing for it. NVML is system-wide, so one process (rank 0) can read every GPU of its node."""
from __future__ import annotations

from dataclasses import dataclass

import torch

GIB = 2**30


@dataclass
class GpuReading:
    index: int
    util_percent: float
    mem_used_gib: float


def nvml_status() -> tuple[bool, str]:
    """(usable, why not): whether NVML answers here, and a short reason when it does not."""
    try:
        import pynvml
    except ImportError:
        return False, "nvidia-ml-py is not installed (pip install 'hydra-dist[nvml]')"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return False, f"NVML did not start: {exc}"
    return True, ""


class GpuMonitor:
    """Readings of the GPUs this process sees, taken when asked (at log boundaries, never per step)."""

    def __init__(self, devices: list[int] | None = None):
        self.devices = list(range(torch.cuda.device_count())) if devices is None else devices
        self.enabled = bool(self.devices) and nvml_status()[0]

    def read(self) -> list[GpuReading]:
        if not self.enabled:
            return []
        try:
            return [GpuReading(i, float(torch.cuda.utilization(i)), torch.cuda.device_memory_used(i) / GIB)
                    for i in self.devices]
        except Exception as exc:  # NVML errors come in many classes; a monitoring hiccup must not stop training
            self.enabled = False
            print(f"warning: NVML readings failed ({exc}); no more gpu/ metrics in this run", flush=True)
            return []
