"""The K shards' gradients summed as integers: exact, so the order (and the world size) cannot change the result.

Per tensor, the largest |g| of any shard, m < 2^e, sets the scale 2^s with s = B - e, B = 52 - ceil(log2 K): every
shard's gradient times 2^s (exact: a power of two, applied in two halves so that float32 holds each) is at most 2^B
and is rounded to an integer; the ranks' integers are added in int64 (K of them stay within 2^52, so float64 holds
the total exactly), and the total times 2^-s is rounded once to the gradient's dtype. So the result is each shard rounded to a multiple of 2^-s (about
m x 2^-(B-1)), summed exactly, rounded once: not what float addition in some order gives, but the same for every
world size, and never further from the exact sum than K x 2^-(s+1) plus half a unit of the result's last place.

Gradients in bf16 or fp16 are scaled in float32 (which holds them exactly); float64 gradients are rounded at the same
2^-s, coarser than float64's own precision for all but the largest elements.

A tensor whose largest |g| is not finite (a NaN or inf in some shard) comes back all NaN, so the loop's
trainer.on_nonfinite (stop or skip) sees it; it is never summed at a scale it does not fit."""
from __future__ import annotations

import math

import torch

from framework.training.engine import ProcessGroup
from framework.training.invariant.shards import check_owned

MANTISSA_BITS = 52  # float64 holds every integer up to 2^53 exactly


class FixedPointSum:
    def __init__(self, shards: int):
        self.shards = shards
        self.bits = MANTISSA_BITS - math.ceil(math.log2(shards))

    def reduce(self, owned: list[list[torch.Tensor]], group: ProcessGroup) -> list[torch.Tensor]:
        """owned[i]: shard (group.rank + i * W)'s gradient, a tensor per parameter. Returns the sum over all K
        shards, a tensor per parameter, bitwise the same for every W that divides K."""
        check_owned(owned, group.world_size, self.shards)
        sizes = [t.numel() for t in owned[0]]
        # one shard's flat row at a time: all K/W of them at once would be a second copy of the stash (on a GPU,
        # what runs out of memory first)
        largest = flat_row(owned[0]).abs_()
        dtype, device, numel = largest.dtype, largest.device, largest.numel()
        work = torch.float64 if dtype == torch.float64 else torch.float32  # holds bf16 and fp16 exactly
        for grads in owned[1:]:
            torch.maximum(largest, flat_row(grads).abs_(), out=largest)  # NaN stays NaN
        largest = torch.stack([part.max() for part in largest.split(sizes)]).double()
        largest = group.all_gather(largest).amax(0)  # one number per tensor; a max is exact in any order
        finite = largest.isfinite()
        scale = self.bits - torch.frexp(torch.where(finite, largest, 0.0)).exponent  # largest < 2^(bits - scale)
        # the sizes on the device once, and the output's length given: without it torch reads the repeats' sum
        # back to the host (on a GPU a synchronization per call)
        repeats = torch.tensor(sizes, device=device)
        # 2^part in float64: float64 gradients' scales pass float32's range
        low, high = (spread(torch.exp2(part.double()), repeats, numel, work)
                     for part in (scale // 2, scale - scale // 2))
        nan = spread(~finite, repeats, numel, torch.bool)
        integers = torch.zeros(numel, dtype=torch.int64, device=device)
        for grads in owned:  # row x 2^scale in two exact steps (2^scale alone can pass float32's range), then rounded
            x = flat_row(grads).to(work).mul_(low).mul_(high).round_()
            integers += x.masked_fill_(nan, 0.0).long()  # an inf is no integer
        total = group.all_reduce_sum(integers)  # exact in any order
        summed = total.double().div_(low).div_(high).to(dtype)  # exact division (in float64), one rounding
        summed = summed.masked_fill_(nan, math.nan)
        return [part.view_as(t) for part, t in zip(summed.split(sizes), owned[0])]


def flat_row(grads: list[torch.Tensor]) -> torch.Tensor:
    """One shard's gradient as a new flat tensor (parameter after parameter)."""
    return torch.cat([t.detach().reshape(-1) for t in grads])


def spread(per_tensor: torch.Tensor, repeats: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A value per tensor as a value per element."""
    return torch.repeat_interleave(per_tensor.to(dtype), repeats, output_size=numel)
