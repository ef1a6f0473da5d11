"""A GPU machine as torch would report it, for the driver's CUDA branch in this process (this machine has no GPU):
the device count, bf16 and the card (its name and memory: trainer.check_fit plans the run against it) are the things
faked, so that the GPU-only refusals are reached."""
from types import SimpleNamespace

import torch


def cuda_reported(monkeypatch, gpus: int, bf16: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)
    name, gib = ("H100", 80) if bf16 else ("Tesla V100", 16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(name=name, total_memory=gib * 2 ** 30))
    # an optimizer's step (trainer.check_fit's plan, on the CPU) asks the current CUDA stream whether a graph is
    # being captured: none is
    monkeypatch.setattr(torch.accelerator, "current_stream",
                        lambda device=None: SimpleNamespace(is_capturing=lambda: False))
    for name in ("SLURM_STEP_NUM_TASKS", "SUBMITIT_EXECUTOR", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
