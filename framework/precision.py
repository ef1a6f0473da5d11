"""trainer.precision -> autocast context and gradient scaler."""
from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "bf16", "fp16")


class Precision:
    def __init__(self, name: str, device: torch.device):
        self.name = name
        self.dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
        self.device_type = device.type
        # fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none.
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale(self, optimizer) -> None:
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> None:
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
