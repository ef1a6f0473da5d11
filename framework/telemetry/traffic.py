"""Gradient bytes on the wire, counted where they leave: the tensors an engine hands to its gradient collectives (ddp's
communication hook, fsdp's reduce-scatter, Horovod's compressor), beside what the same gradients weigh in their own
dtype. Counted per rank and read at each log boundary (comm/bytes_sent/rank{r}, comm/compression_ratio).

"Sent" is the payload handed to the collective, not what its algorithm moves (a ring all-reduce moves about twice
the payload; the ratio of the two is the same with or without compression). Counting is two integer additions per
collective call, on the thread that makes the call; nothing synchronizes the device."""
from __future__ import annotations

import torch
import torch.distributed as dist


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Traffic:
    """What this rank handed to its gradient collectives since the last reset (a log interval), and how many of the
    optimizer steps in it sent fewer bytes than their gradients weigh (compressed steps)."""

    def __init__(self, label: str = "none"):
        self.label = label  # what the run calls its compression: "none", "fp16", "powersgd rank 2"
        self.reset()

    def reset(self) -> None:
        self.sent = 0
        self.uncompressed = 0
        self.compressed_steps = 0
        self._step_sent = 0
        self._step_uncompressed = 0

    def add(self, sent: int, uncompressed: int) -> None:
        """Bytes handed to a collective, and what the same gradients weigh in their own dtype."""
        self.sent += sent
        self.uncompressed += uncompressed
        self._step_sent += sent
        self._step_uncompressed += uncompressed

    def end_step(self) -> None:
        """An optimizer step is done (the meter says so): was what it sent compressed?"""
        if self._step_sent < self._step_uncompressed:
            self.compressed_steps += 1
        self._step_sent = self._step_uncompressed = 0


class CountedReduceScatter:
    """FSDP2's reduce-scatter of gradients (FSDPModule.set_custom_reduce_scatter), counted: the collective its default
    makes (torch.distributed.reduce_scatter_single), its input (in the reduce dtype) counted as sent and, as what it
    weighs uncompressed, the same elements in the parameters' dtype. It answers torch's ReduceScatter interface
    (allocate, __call__) without subclassing it: that class lives in a private module of FSDP2."""

    def __init__(self, traffic: Traffic, parameter_element_size: int):
        self.traffic, self.full = traffic, parameter_element_size

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op: bool = False):
        self.traffic.add(nbytes(input_tensor), input_tensor.numel() * self.full)
        return dist.reduce_scatter_single(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
