"""trainer.precision -> autocast context, gradient scaler, and the optimizer step (clip, skip, step).

An engine that owns mixed precision (FSDP's MixedPrecisionPolicy), backward and the step (DeepSpeed) or must
synchronize before clipping (Horovod) puts its own subclass into what its parallelize() returns
(framework/strategies/); the training loop only calls these methods."""
from __future__ import annotations

import contextlib
import math

import torch

def autocast_dtype(name: str) -> torch.dtype | None:
    """The dtype trainer.precision=name computes in under autocast (None: no autocast)."""
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


class Precision:
    def __init__(self, name: str, device: torch.device):
        self.name = name
        self.dtype = autocast_dtype(name)
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

    def clip_grad_norm(self, model, optimizer, max_norm: float | None) -> torch.Tensor:
        """Unscaled, all-reduced gradients' total norm, clipped to max_norm (None: measure only)."""
        self.unscale(optimizer)
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or math.inf)

    def step(self, optimizer) -> None:
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def optimizer_step(self, model, optimizer, max_norm: float | None, skip_nonfinite: bool) -> bool:
        """Clip if asked, then step. Returns False when the step was skipped for a non-finite gradient
        (reported in skip mode only: it costs a sync; in stop mode the loss check at the log boundary decides)."""
        if max_norm or skip_nonfinite:
            norm = self.clip_grad_norm(model, optimizer, max_norm)
            # Gradients are already all-reduced here, so every rank sees the same norm and makes the same choice.
            if skip_nonfinite and not self.scaler and not torch.isfinite(norm):  # a sync, skip mode only
                return False
        if self.scaler and skip_nonfinite:
            # fp16's GradScaler skips a non-finite step by itself and then lowers its scale; that drop is
            # how we learn the step was skipped (its found-inf flags are private).
            scale_before = self.scaler.get_scale()
            self.step(optimizer)
            return self.scaler.get_scale() >= scale_before
        self.step(optimizer)
        return True
