"""Tensors of a shape the receiver does not know, between pipeline ranks: a small header (dtype, rank of the tensor,
its sizes) goes first. Evaluation's forward-only pass uses these (its batches vary in size, which the training
schedule's fixed buffers do not allow). Every tensor lives on the group's device (nccl needs CUDA tensors, gloo CPU
ones): the caller passes that device."""
from __future__ import annotations

import torch
import torch.distributed as dist

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)
MAX_DIMS = 8


def _header(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if t.dim() > MAX_DIMS or t.dtype not in DTYPES:
        raise ValueError(f"a pipeline stage passed a {t.dtype} tensor of {t.dim()} dimensions; stages pass tensors of "
                         f"at most {MAX_DIMS} dimensions of {', '.join(str(d) for d in DTYPES)}")
    return torch.tensor([DTYPES.index(t.dtype), t.dim(), *t.shape, *[0] * (MAX_DIMS - t.dim())], dtype=torch.int64,
                        device=device)


def _empty(header: torch.Tensor, device: torch.device) -> torch.Tensor:
    dtype, dims, *shape = header.tolist()
    return torch.empty(shape[:dims], dtype=DTYPES[dtype], device=device)


def send(t: torch.Tensor, peer: int, group, device: torch.device) -> None:
    """To `peer` (its rank in `group`)."""
    dist.send(_header(t, device), group=group, group_dst=peer)
    dist.send(t.detach().contiguous(), group=group, group_dst=peer)


def recv(peer: int, group, device: torch.device) -> torch.Tensor:
    header = torch.empty(2 + MAX_DIMS, dtype=torch.int64, device=device)
    dist.recv(header, group=group, group_src=peer)
    t = _empty(header, device)
    dist.recv(t, group=group, group_src=peer)
    return t


def broadcast(t: torch.Tensor | None, source: int, group, device: torch.device) -> torch.Tensor:
    """`source`'s t (its rank in `group`) on every rank of the group; the others pass None."""
    header = _header(t, device) if t is not None else torch.empty(2 + MAX_DIMS, dtype=torch.int64, device=device)
    dist.broadcast(header, group=group, group_src=source)
    out = t.detach().contiguous() if t is not None else _empty(header, device)
    dist.broadcast(out, group=group, group_src=source)
    return out
