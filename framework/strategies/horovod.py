"""Horovod: one process per GPU (or N CPU workers), started by Horovod's own runner (gloo controller),
gradients averaged by hvd.DistributedOptimizer. horovod is imported only here, and only when this
strategy is chosen."""
from __future__ import annotations

import contextlib
import importlib
import os

import torch
from torch import nn

from framework.config.strategy_options import HorovodOptions
from framework.errors import ConfigError
from framework.process.environment import HOROVOD, outer_launcher, threads_per_worker
from framework.strategies.base import Strategy, Wrapped
from framework.training.precision import Precision
from framework.telemetry.wait_clock import WaitClock, start_when_gradients_are_done

CPU_WORKERS_WITHOUT_GPU = 2
INSTALL = "bash scripts/setup.d/10-horovod.sh .venv (builds horovod 0.28.1 for this torch; see README, Horovod)"


def import_horovod():
    """horovod.torch, or one clear error naming the install command."""
    try:
        return importlib.import_module("horovod.torch")
    except ImportError as exc:
        raise ConfigError(f"strategy=horovod is not allowed: horovod is not usable here ({exc}); install it with: "
                          f"{INSTALL}") from None


class HorovodPrecision(Precision):
    """Horovod all-reduces gradients inside optimizer.step(). Clipping, the NaN check and fp16's unscale must
    see the averaged gradients, so those paths synchronize first and then step without synchronizing again."""

    def optimizer_step(self, model, optimizer, max_norm, skip_nonfinite) -> bool:
        if not (max_norm or skip_nonfinite or self.scaler):
            return super().optimizer_step(model, optimizer, max_norm, skip_nonfinite)
        optimizer.synchronize()
        with optimizer.skip_synchronize():
            return super().optimizer_step(model, optimizer, max_norm, skip_nonfinite)


class HorovodStrategy(Strategy):
    Options = HorovodOptions
    options: HorovodOptions
    channels_last_refusal = "Horovod's collectives take contiguous tensors only"
    runs_in_process = False
    outer_launchers = frozenset({HOROVOD})

    # ---- driver side -------------------------------------------------------------------------
    @staticmethod
    def under_horovodrun() -> bool:
        """horovodrun (or another Horovod launcher) started the workers, this process among them."""
        return outer_launcher() == HOROVOD

    def np(self) -> int:
        if self.under_horovodrun():
            return int(os.environ["HOROVOD_SIZE"])
        if self.options.np is not None:
            return self.options.np
        return torch.cuda.device_count() if self.use_cuda else CPU_WORKERS_WITHOUT_GPU

    def processes(self) -> int:
        return self.np()

    def validate(self) -> None:
        o, grad_accum = self.options, self.trainer.grad_accum
        if o.backward_passes_per_step != grad_accum:
            raise ConfigError(
                f"strategy.backward_passes_per_step={o.backward_passes_per_step!r} is not allowed: it is "
                f"trainer.grad_accum ({grad_accum}), the one setting for gradient accumulation; set trainer.grad_accum "
                "instead")
        if self.under_horovodrun():
            self._validate_under_horovodrun()
        elif o.hosts is not None and o.np > sum(o.host_slots().values()):
            raise ConfigError(f"strategy.np={o.np} is not allowed with strategy.hosts={o.hosts!r}: they offer only "
                              f"{sum(o.host_slots().values())} slot(s); raise the slots or lower strategy.np")
        hvd = import_horovod()
        if not hvd.gloo_built():
            raise ConfigError(f"strategy=horovod is not allowed: this horovod has no gloo controller; rebuild it: {INSTALL}")
        if self.use_cuda and not hvd.nccl_built():
            raise ConfigError(
                "strategy=horovod on GPUs is not allowed with this horovod build: it has no NCCL operations; rebuild "
                "it on a GPU machine (HYDRA_DIST_HOROVOD_NCCL=1, see README, Horovod), or use trainer.accelerator=cpu"
            )
        local_workers = int(os.environ["HOROVOD_LOCAL_SIZE"]) if self.under_horovodrun() else self.np()
        if self.use_cuda and o.hosts is None and local_workers > torch.cuda.device_count():
            gpus = torch.cuda.device_count()
            raise ConfigError(f"strategy.np={local_workers} is not allowed: this machine has {gpus} GPU(s) and horovod "
                              f"with NCCL needs one GPU per worker; use at most {gpus} on this machine")
        if o.op == "adasum" and not hvd.mpi_built():
            raise ConfigError("strategy.op=adasum is not allowed with this horovod build: Adasum needs horovod built "
                              "with MPI (ours uses gloo); use average or sum")
        if o.op == "adasum" and grad_accum > 1:
            raise ConfigError("strategy.op=adasum is not allowed with trainer.grad_accum > 1 in this framework; "
                              "use average or sum")

    def _validate_under_horovodrun(self) -> None:
        started, o = int(os.environ["HOROVOD_SIZE"]), self.options
        if o.np is not None and o.np != started:
            raise ConfigError(f"strategy.np={o.np} is not allowed under horovodrun, which started {started} workers: "
                              "leave strategy.np unset (horovodrun -np decides)")
        if o.hosts is not None:
            raise ConfigError(f"strategy.hosts={o.hosts!r} is not allowed under horovodrun: its -H option decides "
                              "the hosts; leave strategy.hosts unset")

    def launch(self, entry, payload):
        from framework.launch.horovod_runner import launch_horovod

        o = self.options
        if o.np is None and not self.use_cuda:
            print(f"strategy=horovod: no GPU in use, so {CPU_WORKERS_WITHOUT_GPU} CPU workers on gloo "
                  "(set strategy.np to change)", flush=True)
        local = self.np() if o.hosts is None else max(o.host_slots().values())
        return launch_horovod(entry, payload, np=self.np(), hosts=o.hosts, local_workers=local)

    # ---- joining -----------------------------------------------------------------------------
    def setup(self) -> None:
        self.hvd = hvd = import_horovod()
        hvd.init()
        self.rank, self.local_rank, self.world_size = hvd.rank(), hvd.local_rank(), hvd.size()
        if self.use_cuda:
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", threads_per_worker(hvd.local_size()))))

    def leave_group(self, wait_for_peers: bool) -> None:
        """Shut Horovod down, with wait_for_peers only once every rank got here."""
        if getattr(self, "hvd", None) is not None and self.hvd.is_initialized():
            if wait_for_peers:
                self.hvd.barrier()
            self.hvd.shutdown()

    # ---- wrapping ----------------------------------------------------------------------------
    def wrap(self, model: nn.Module, make_optimizer) -> Wrapped:
        hvd, o = self.hvd, self.options
        hvd.broadcast_parameters(self.unwrap(model).state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(
            make_optimizer(model.parameters()), named_parameters=self.unwrap(model).named_parameters(),
            compression=hvd.Compression.fp16 if o.compression == "fp16" else hvd.Compression.none,
            op={"average": hvd.Average, "sum": hvd.Sum, "adasum": hvd.Adasum}[o.op],
            backward_passes_per_step=self.trainer.grad_accum,
        )
        # Not hvd.broadcast_optimizer_state: on a fresh optimizer it first takes a step with zero gradients to
        # create the state, which advances Adam's step count (and applies weight decay), so the run would no
        # longer match one process. Sending rank 0's state dict does the same job without a step.
        optimizer.load_state_dict(hvd.broadcast_object(optimizer.state_dict(), root_rank=0))
        _accept_set_to_none(optimizer)
        self.clock = WaitClock(self.device)
        start_when_gradients_are_done(self.unwrap(model), self.clock)
        _stop_clock_after_synchronize(optimizer, self.clock)
        return Wrapped(model, optimizer, HorovodPrecision(self.trainer.precision, self.device), self.clock)

    # DistributedOptimizer counts backward passes itself (backward_passes_per_step = trainer.grad_accum) and
    # all-reduces after the last one, so every micro-batch's backward runs the same way: the default sync().

    # ---- collectives -------------------------------------------------------------------------
    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        return self.hvd.allgather(t.unsqueeze(0).contiguous())

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self.hvd.allreduce(t, op=self.hvd.Sum)

    def gather_objects(self, obj) -> list:
        return self.hvd.allgather_object(obj)

    def broadcast_object(self, obj):
        return broadcast_from_rank0(self.hvd, obj)

    def barrier(self) -> None:
        with self.clock.blocking() if self.clock else contextlib.nullcontext():
            self.hvd.barrier()


def broadcast_from_rank0(hvd, obj):
    # One explicit name: Horovod's default is the object's type name, and rank 0 sends a dict while the others
    # pass None, so the collectives would never match.
    return hvd.broadcast_object(obj, root_rank=0, name="hydra_dist.broadcast_object")


def _accept_set_to_none(optimizer) -> None:
    """Horovod 0.28.1's zero_grad() takes no arguments (it predates set_to_none); the loop passes
    set_to_none=True, torch's default, so route that to Horovod's own zero_grad and its race check."""
    horovod_zero_grad = optimizer.zero_grad

    def zero_grad(set_to_none: bool = True):
        if set_to_none:
            return horovod_zero_grad()
        return torch.optim.Optimizer.zero_grad(optimizer, set_to_none=False)

    optimizer.zero_grad = zero_grad


def _stop_clock_after_synchronize(optimizer, clock: WaitClock) -> None:
    """DistributedOptimizer starts each gradient's all-reduce from its hook and waits for all of them in
    synchronize() (called by step(), or first by HorovodPrecision): once it returns, this rank is released."""
    horovod_synchronize = optimizer.synchronize

    def synchronize():
        horovod_synchronize()
        clock.stop()

    optimizer.synchronize = synchronize
