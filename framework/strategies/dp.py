"""nn.DataParallel: one process, the model replicated on every visible GPU, each batch split across them."""
from __future__ import annotations

import torch
from torch import nn

from framework.config.strategy_options import DPOptions
from framework.errors import ConfigError
from framework.strategies.base import Strategy, Wrapped
from framework.telemetry.replica_clock import ReplicaClock, TimedReplica
from framework.training.precision import Precision, autocast_dtype


class DataParallelStrategy(Strategy):
    Options = DPOptions
    options: DPOptions

    def validate(self) -> None:
        ids = self.options.device_ids
        if ids and self.use_cuda and max(ids) >= torch.cuda.device_count():
            raise ConfigError(
                f"strategy.device_ids={ids} is not allowed: this machine has {torch.cuda.device_count()} GPUs "
                f"(ids 0..{torch.cuda.device_count() - 1})"
            )
        gpus = len(self._device_ids())
        if self.trainer.compile and gpus > 1:
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
        self.device_ids = self._device_ids()
        if self.use_cuda:
            # DataParallel keeps the master copy on device_ids[0]; make it the current device so that pinned
            # memory, the current CUDA RNG and stray allocations never open a context on an excluded GPU.
            torch.cuda.set_device(self.device_ids[0])
            self.device = torch.device("cuda", self.device_ids[0])
        else:
            self.device = torch.device("cpu")
            print("strategy=dp: no GPU in use, so nn.DataParallel runs the model on the CPU (one replica)", flush=True)

    def wrap(self, model: nn.Module, make_optimizer) -> Wrapped:
        """Every replica runs TimedReplica (framework/telemetry/replica_clock.py: the run's autocast dtype inside the
        replica thread, forward/backward timed on the replica's GPU); on the CPU the one replica runs it directly."""
        devices = [torch.device("cuda", i) for i in self.device_ids] or [self.device]
        self.clock = ReplicaClock(devices)
        dtype = autocast_dtype(self.trainer.precision) if self.device_ids else None
        replica = TimedReplica(model, self.clock, self.device.type, dtype)
        outer = nn.DataParallel(replica, device_ids=self.device_ids) if self.device_ids else replica
        outer.register_forward_pre_hook(lambda *_: self.clock.begin_micro_batch())
        return Wrapped(outer, make_optimizer(outer.parameters()), Precision(self.trainer.precision, self.device),
                       self.clock)

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
