"""GPU utilization and memory in use, from NVML (nvidia-ml-py: `pip install 'hydra-dist[nvml]'`).

NVML numbers GPUs in PCI bus order, CUDA (by default) fastest first, and CUDA_VISIBLE_DEVICES renumbers
them again; so a GPU is found in NVML by its UUID, which both report, never by its index. Without
nvidia-ml-py, without a driver or without a GPU every reading is empty: callers show or log nothing for it.
NVML is system-wide, so one process (rank 0) can read every GPU of its node."""
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
        import pynvml  # the nvml extra
    except ImportError:
        return False, "nvidia-ml-py is not installed (pip install 'hydra-dist[nvml]')"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return False, f"NVML did not start: {exc}"
    return True, ""


def _plain_uuid(uuid) -> str:
    """'GPU-8e2b...' (NVML, str or bytes) and '8e2b...' (torch) as one comparable form."""
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    return text.lower().removeprefix("gpu-")


def nvml_handles(cuda_indices: list[int]) -> dict[int, object]:
    """NVML's handle of each CUDA device index given, matched by UUID. Raises LookupError for a device NVML
    does not list (e.g. a MIG slice), so no reading is ever attributed to the wrong GPU."""
    import pynvml  # the nvml extra (nvml_status() said it is there)

    by_uuid = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        by_uuid[_plain_uuid(pynvml.nvmlDeviceGetUUID(handle))] = handle
    handles = {}
    for index in cuda_indices:
        uuid = _plain_uuid(torch.cuda.get_device_properties(index).uuid)
        if uuid not in by_uuid:
            raise LookupError(f"cuda:{index} (UUID {uuid}) is not among the GPUs NVML lists")
        handles[index] = by_uuid[uuid]
    return handles


def read_gpus(handles: dict[int, object]) -> list[GpuReading]:
    import pynvml  # the nvml extra (nvml_status() said it is there)

    return [GpuReading(index, float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                       pynvml.nvmlDeviceGetMemoryInfo(h).used / GIB) for index, h in handles.items()]


class GpuMonitor:
    """Readings of the GPUs this process sees, taken when asked (at log boundaries, never per step)."""

    def __init__(self, devices: list[int] | None = None):
        devices = list(range(torch.cuda.device_count())) if devices is None else devices
        self.handles: dict[int, object] = {}
        if devices and nvml_status()[0]:
            try:
                self.handles = nvml_handles(devices)
            except Exception as exc:  # NVML errors come in many classes; monitoring must not stop training
                print(f"warning: cannot match GPUs to NVML ({exc}); no gpu/ metrics in this run", flush=True)

    def read(self) -> list[GpuReading]:
        if not self.handles:
            return []
        try:
            return read_gpus(self.handles)
        except Exception as exc:
            self.handles = {}
            print(f"warning: NVML readings failed ({exc}); no more gpu/ metrics in this run", flush=True)
            return []
