"""strategy.sync_batchnorm=true: BatchNorm normalizes with the statistics of the whole global batch, not each rank's
micro-batch, so that ddp trains a BatchNorm model as one process does. On GPUs that is torch's nn.SyncBatchNorm. Its
kernels (batch_norm_stats and the rest) exist for GPUs only and its forward refuses CPU tensors, so on CPU workers
(gloo) the BatchNorm modules compute them here: each channel's sum and sum of squares over the rank's micro-batch,
summed over the ranks by an all-reduce that autograd goes back through (the backward sums each rank's gradient of the
statistics, as SyncBatchNorm's own backward does)."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def convert_sync_batchnorm(model: nn.Module, device: torch.device) -> nn.Module:
    """Every BatchNorm*d of the model synchronized: torch's nn.SyncBatchNorm on GPUs, CpuSyncBatchNorm on the CPU."""
    if device.type != "cpu":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    for module in model.modules():
        if isinstance(module, _BatchNorm) and not isinstance(module, nn.SyncBatchNorm):
            # the same module (its parameters, buffers and state dict keys) with the forward below: DDP refuses any
            # nn.SyncBatchNorm on the CPU, so this is no subclass of it
            module.__class__ = CpuSyncBatchNorm
    return model


class _SumOverRanks(torch.autograd.Function):
    """all_reduce(SUM) whose backward is all_reduce(SUM) of the gradient: every rank's loss depends on every rank's
    statistics."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        summed = tensor.clone()
        dist.all_reduce(summed, group=group)
        return summed

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        summed = grad.clone()
        dist.all_reduce(summed, group=ctx.group)
        return summed, None


class CpuSyncBatchNorm(_BatchNorm):
    """BatchNorm over the whole world's batch, on CPU tensors (torch's nn.SyncBatchNorm refuses them). _BatchNorm is
    the base every BatchNorm*d shares (torch has no public one); like nn.SyncBatchNorm, any input of 2 or more
    dimensions."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(input)
        self._check_input_dim(input)
        group = dist.group.WORLD if dist.is_initialized() else None
        if group is None or dist.get_world_size(group) == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, True,
                                self._average_factor(), self.eps)
        channels = input.size(1)
        dims = [0, *range(2, input.dim())]
        wide = input.double()  # sums of squares in float64: E[x^2] - E[x]^2 cancels less
        count = torch.tensor([input.numel() // channels], dtype=torch.float64)
        stats = _SumOverRanks.apply(torch.cat([wide.sum(dims), (wide * wide).sum(dims), count]), group)
        total = stats[-1]
        mean = stats[:channels] / total
        var = (stats[channels:2 * channels] / total - mean * mean).clamp_min(0)
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                factor = self._average_factor()
                self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
                unbiased = var * total / (total - 1).clamp_min(1)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)
        shape = (1, channels) + (1,) * (input.dim() - 2)
        out = (wide - mean.view(shape)) * torch.rsqrt(var + self.eps).view(shape)
        out = out.to(input.dtype)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    def _average_factor(self) -> float:
        """BatchNorm's own: the momentum, or a cumulative average (momentum=None); counts the batch as tracked."""
        if not (self.training and self.track_running_stats and self.num_batches_tracked is not None):
            return 0.0 if self.momentum is None else self.momentum
        self.num_batches_tracked.add_(1)
        return 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
