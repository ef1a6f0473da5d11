"""nn.DataParallel: one process, the model replicated on every visible GPU, each batch split across them."""
from __future__ import annotations

import torch
from torch import nn

from framework.config.checks import int_list
from framework.errors import ConfigError
from framework.callbacks.faults import planned_faults
from framework.training.precision import autocast_dtype
from framework.telemetry.replica_clock import ReplicaClock, TimedReplica
from framework.strategies.base import Strategy


class DataParallelStrategy(Strategy):
    name = "dp"
    slows_replicas = True

    def validate(self) -> None:
        ids = int_list(self.cfg, "strategy.device_ids", 0, optional=True)
        if ids and self.use_cuda and max(ids) >= torch.cuda.device_count():
            raise ConfigError(
                f"strategy.device_ids={ids} is not allowed: this machine has {torch.cuda.device_count()} GPUs "
                f"(ids 0..{torch.cuda.device_count() - 1})"
            )
        if ids and len(set(ids)) != len(ids):
            raise ConfigError(f"strategy.device_ids={ids} is not allowed: each GPU may appear once")
        gpus = len(self._device_ids())
        if self.cfg.trainer.compile and gpus > 1:
            raise ConfigError(
                f"trainer.compile=true is not allowed with strategy=dp on {gpus} GPUs: nn.DataParallel copies the "
                "compiled module into every replica, and its compiled code stays bound to the first GPU's weights; "
                "use strategy=ddp (one compiled model per process), or trainer.compile=false"
            )

    def _device_ids(self) -> list[int]:
        return list(self.options.device_ids or range(torch.cuda.device_count())) if self.use_cuda else []

    def describe(self) -> str:
        ids = self._device_ids()
        if not ids:
            return "1 process on the CPU (no GPU in use, so nn.DataParallel runs one replica there)"
        return f"1 process, nn.DataParallel over GPU(s) {ids} (one replica each)"

    def setup(self) -> None:
        if self.use_cuda:
            self.device_ids = self._device_ids()
            # DataParallel keeps the master copy on device_ids[0]; make it the current device so that pinned
            # memory, the current CUDA RNG and stray allocations never open a context on an excluded GPU.
            torch.cuda.set_device(self.device_ids[0])
            self.device = torch.device("cuda", self.device_ids[0])
        else:
            self.device_ids = []
            self.device = torch.device("cpu")
            print("strategy=dp: no GPU in use, so nn.DataParallel runs the model on the CPU (one replica)", flush=True)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Every replica runs TimedReplica (framework/telemetry/replica_clock.py: the run's autocast dtype inside the replica
        thread, forward/backward timed on the replica's GPU); on the CPU the one replica runs it directly."""
        devices = [torch.device("cuda", i) for i in self.device_ids] or [self.device]
        delays = [planned_faults(slot).get("slow_rank", 0.0) for slot in range(len(devices))]
        self.wait_clock = ReplicaClock(devices, delays)
        dtype = autocast_dtype(self.cfg.trainer.precision) if self.device_ids else None
        replica = TimedReplica(model, self.wait_clock, self.device.type, dtype)
        outer = nn.DataParallel(replica, device_ids=self.device_ids) if self.device_ids else replica
        outer.register_forward_pre_hook(lambda *_: self.wait_clock.begin_micro_batch())
        return outer

    def unwrap(self, model: nn.Module) -> nn.Module:
        if isinstance(model, nn.DataParallel):
            model = model.module
        if isinstance(model, TimedReplica):
            model = model.module
        return super().unwrap(model)

    def local_slots(self) -> int:
        return max(1, len(self.device_ids))

    def cuda_devices(self) -> list[int]:
        return list(self.device_ids)

    def slot_sizes(self, batch: int) -> list[int]:
        return chunk_sizes(batch, len(self.device_ids))


def chunk_sizes(batch: int, replicas: int) -> list[int]:
    """How nn.DataParallel scatters a batch over `replicas` GPUs: torch.chunk's ceil(batch / replicas) per replica,
    so a batch smaller than the GPUs (or one that divides badly: 10 over 8 is 5 chunks of 2) runs on fewer
    replicas, device_ids[:chunks]; the others get nothing and are not slots of the run."""
    if replicas <= 1:
        return [batch]
    return [len(c) for c in torch.arange(batch).chunk(replicas)]
