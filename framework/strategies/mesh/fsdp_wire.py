"""strategy=fsdp strategy.compression=bf16: gradients cast to bf16 for the reduce-scatter only. FSDP2's reduce_dtype
is also the dtype it holds an accumulation's gradients in between micro-batches (set_requires_gradient_sync(False)):
bf16 there would sum k micro-batches with 8 mantissa bits. So reduce_dtype stays fp32 (what every held and sharded
gradient is), and this reduce-scatter (FSDPModule.set_custom_reduce_scatter, run in FSDP2's reduce-scatter stream)
sends bf16 and writes the result back into FSDP2's fp32 output. It answers torch's ReduceScatter interface (allocate,
__call__) without subclassing it: that class lives in a private module of FSDP2."""
from __future__ import annotations

import torch
import torch.distributed as dist


def reduce_scatter(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op: bool = False):
    """FSDP2's own default: torch.distributed.reduce_scatter_single."""
    return dist.reduce_scatter_single(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


class WireDtype:
    def __init__(self, dtype: torch.dtype, send=reduce_scatter):
        """send: the reduce-scatter the cast gradients go through (one that counts bytes: what it is handed is what
        travels)."""
        self.dtype, self.send = dtype, send

    def through(self, send) -> "WireDtype":
        return WireDtype(self.dtype, send)

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op: bool = False):
        wire = torch.empty(output_tensor.shape, dtype=self.dtype, device=output_tensor.device)
        work = self.send(wire, input_tensor.to(self.dtype), group=group, op=op, async_op=async_op)
        if work is not None:  # FSDP2 calls it synchronously, in its reduce-scatter stream; an async caller waits here
            work.wait()
        output_tensor.copy_(wire)
        return None

