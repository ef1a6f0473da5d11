"""Horovod: one process per GPU (or N CPU workers), started by Horovod's own runner (gloo controller), gradients
averaged by hvd.DistributedOptimizer. horovod is imported only in a horovod run's processes."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from framework.config.strategy_options import HorovodOptions
from framework.common.errors import ConfigError
from framework.launch.horovod_runner import INSTALL, import_horovod
from framework.session.environment import Ranks
from framework.strategies.base import Strategy
from framework.strategies.groups import HorovodGroup
from framework.strategies.starters import Horovod
from framework.telemetry.traffic import Traffic, nbytes
from framework.telemetry.wait_clock import WaitClock, start_when_gradients_are_done, stop_after
from framework.training.checkpoint_io import CheckpointIO
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.precision import Precision


class HorovodPrecision(Precision):
    """Horovod all-reduces gradients inside optimizer.step(). Clipping, the NaN check and fp16's unscale must
    see the averaged gradients, so those paths synchronize first and then step without synchronizing again."""

    def optimizer_step(self, model, optimizer, max_norm, skip_nonfinite) -> bool:
        if not (max_norm or skip_nonfinite or self.scaler):
            return super().optimizer_step(model, optimizer, max_norm, skip_nonfinite)
        optimizer.synchronize()
        with optimizer.skip_synchronize():
            return super().optimizer_step(model, optimizer, max_norm, skip_nonfinite)


class CountedCompression:
    """Horovod's compressor (none or fp16), the tensor it hands to the all-reduce counted against what the gradient
    weighs (framework/telemetry/traffic.py). DistributedOptimizer calls compress and decompress on whatever it is
    given."""

    def __init__(self, compressor, traffic: Traffic):
        self.compressor, self.traffic = compressor, traffic

    def compress(self, tensor: torch.Tensor):
        compressed, context = self.compressor.compress(tensor)
        self.traffic.add(nbytes(compressed), nbytes(tensor))
        return compressed, context

    def decompress(self, tensor: torch.Tensor, context):
        return self.compressor.decompress(tensor, context)


@dataclass(kw_only=True)
class HorovodWrapped(Wrapped):
    """CountsTraffic: its compressor counts the bytes each all-reduce is handed. OwnClock: gradients are reduced
    from their hooks and waited for in the DistributedOptimizer's synchronize()."""

    traffic: Traffic | None = None

    def wait_clock(self, group: ProcessGroup) -> WaitClock:
        clock = WaitClock(group.device)
        start_when_gradients_are_done(self.module, clock)
        stop_after(self.optimizer, "synchronize", clock)
        return clock


class HorovodStrategy(Strategy):
    Options = HorovodOptions
    options: HorovodOptions
    channels_last_refusal = "Horovod's collectives take contiguous tensors only"
    outer_kinds = Horovod.outer_kinds

    def __init__(self, options: HorovodOptions, trainer, ranks: Ranks | None):
        super().__init__(options, trainer, Horovod(options, trainer.cuda, ranks))

    def validate(self) -> None:
        options, grad_accum, starter = self.options, self.trainer.grad_accum, self.starter
        if options.backward_passes_per_step != grad_accum:
            raise ConfigError(
                f"strategy.backward_passes_per_step={options.backward_passes_per_step!r} is not allowed: it is "
                f"trainer.grad_accum ({grad_accum}), the one setting for gradient accumulation; set trainer.grad_accum "
                "instead")
        if starter.under_horovodrun():
            self._validate_under_horovodrun()
        elif options.hosts is not None and options.np > sum(options.host_slots().values()):
            raise ConfigError(f"strategy.np={options.np} is not allowed with strategy.hosts={options.hosts!r}: they "
                              f"offer only {sum(options.host_slots().values())} slot(s); raise the slots or lower "
                              "strategy.np")
        hvd = import_horovod()
        if not hvd.gloo_built():
            raise ConfigError(f"strategy=horovod is not allowed: this horovod has no gloo controller; rebuild it: {INSTALL}")
        if self.trainer.cuda and not hvd.nccl_built():
            raise ConfigError(
                "strategy=horovod on GPUs is not allowed with this horovod build: it has no NCCL operations; rebuild "
                "it on a GPU machine (HYDRA_DIST_HOROVOD_NCCL=1, see docs/engines/horovod.md), or use "
                "trainer.accelerator=cpu"
            )
        local_workers = starter.local_workers()
        if self.trainer.cuda and options.hosts is None and local_workers > torch.cuda.device_count():
            gpus = torch.cuda.device_count()
            raise ConfigError(f"strategy.np={local_workers} is not allowed: this machine has {gpus} GPU(s) and horovod "
                              f"with NCCL needs one GPU per worker; use at most {gpus} on this machine")
        if options.compression == "fp16" and options.op == "average" and hvd.rocm_built():
            raise ConfigError("strategy.compression=fp16 is not allowed with this horovod build (ROCm): it would sum "
                              "fp16 gradients before averaging them (Horovod takes no gradient_predivide_factor "
                              "there), overflowing world size times sooner; use strategy.compression=none")
        if options.op == "adasum" and not hvd.mpi_built():
            raise ConfigError("strategy.op=adasum is not allowed with this horovod build: Adasum needs horovod built "
                              "with MPI (ours uses gloo); use average or sum")
        if options.op == "adasum" and grad_accum > 1:
            raise ConfigError("strategy.op=adasum is not allowed with trainer.grad_accum > 1 in this framework; "
                              "use average or sum")

    def _validate_under_horovodrun(self) -> None:
        started, options = self.starter.processes(), self.options
        if options.np is not None and options.np != started:
            raise ConfigError(f"strategy.np={options.np} is not allowed under horovodrun, which started {started} workers: "
                              "leave strategy.np unset (horovodrun -np decides)")
        if options.hosts is not None:
            raise ConfigError(f"strategy.hosts={options.hosts!r} is not allowed under horovodrun: its -H option decides "
                              "the hosts; leave strategy.hosts unset")

    def join(self) -> ProcessGroup:
        return HorovodGroup.join(import_horovod(), self.trainer.cuda)

    def parallelize(self, model: nn.Module, make_optimizer, group: ProcessGroup) -> Wrapped:
        hvd, options = group.hvd, self.options
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        traffic = Traffic(str(options.compression))
        compressor = hvd.Compression.fp16 if options.compression == "fp16" else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(
            make_optimizer(model.parameters()), named_parameters=model.named_parameters(),
            compression=CountedCompression(compressor, traffic),
            op={"average": hvd.Average, "sum": hvd.Sum, "adasum": hvd.Adasum}[options.op],
            backward_passes_per_step=self.trainer.grad_accum,
            gradient_predivide_factor=predivide_factor(options, group.world_size),
        )
        # Not hvd.broadcast_optimizer_state: on a fresh optimizer it first takes a step with zero gradients to
        # create the state, which advances Adam's step count (and applies weight decay), so the run would no
        # longer match one process. Sending rank 0's state dict does the same job without a step.
        optimizer.load_state_dict(group.broadcast_object(optimizer.state_dict()))
        _accept_set_to_none(optimizer)
        # DistributedOptimizer counts backward passes itself (backward_passes_per_step = trainer.grad_accum) and
        # all-reduces after the last one, so every micro-batch's backward runs the same way: no GradientSync.
        return HorovodWrapped(model, optimizer, HorovodPrecision(self.trainer.precision, group.device),
                              CheckpointIO(group.rank, group.world_size, group.cuda_devices), model, traffic=traffic)


def predivide_factor(options: HorovodOptions, world_size: int) -> float:
    """Horovod's average sums first and divides after (postscale): fp16 gradients would be summed in fp16 and
    overflow world_size times sooner than each rank's own. Under fp16 compression each rank divides first (prescale
    1 / world_size, as torch's fp16 hook for ddp does), so the sum is already the mean. Horovod refuses the factor
    on ROCm builds and with any op but average (validate() refuses fp16 on ROCm)."""
    return float(world_size) if options.compression == "fp16" and options.op == "average" else 1.0


def _accept_set_to_none(optimizer) -> None:
    """Horovod 0.28.1's zero_grad() takes no arguments (it predates set_to_none); the loop passes
    set_to_none=True, torch's default, so route that to Horovod's own zero_grad and its race check."""
    horovod_zero_grad = optimizer.zero_grad

    def zero_grad(set_to_none: bool = True):
        if set_to_none:
            return horovod_zero_grad()
        return torch.optim.Optimizer.zero_grad(optimizer, set_to_none=False)

    optimizer.zero_grad = zero_grad
