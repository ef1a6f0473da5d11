"""nn.DataParallel: one process, the model replicated on every visible GPU, each batch split across them."""
from __future__ import annotations

from collections.abc import MutableMapping

import torch
from torch import nn

from framework.config.strategy_options import DPOptions
from framework.data.batches import batch_size, leaves
from framework.common.errors import ConfigError
from framework.session.environment import Ranks
from framework.strategies.base import Strategy
from framework.strategies.starters import InProcess
from framework.telemetry.replica_clock import ReplicaClock, time_replicas
from framework.training.checkpoint_io import CheckpointIO
from framework.training.engine import LocalGroup, ProcessGroup, Wrapped
from framework.training.precision import Precision, autocast_dtype


class DataParallelStrategy(Strategy):
    Options = DPOptions
    options: DPOptions
    muon_steps = "whole"

    def __init__(self, options: DPOptions, trainer, ranks: Ranks | None):
        ids = self._device_ids(options, trainer.cuda)
        where = (f"1 process, nn.DataParallel over GPU(s) {ids} (one replica each)" if ids else
                 "1 process on the CPU (no GPU in use, so nn.DataParallel runs one replica there)")
        super().__init__(options, trainer, InProcess(where, ranks))

    @staticmethod
    def _device_ids(options: DPOptions, cuda: bool) -> list[int]:
        return list(options.device_ids or range(torch.cuda.device_count())) if cuda else []

    def validate(self) -> None:
        ids, gpus = self.options.device_ids, torch.cuda.device_count()
        if ids and self.trainer.cuda and max(ids) >= gpus:
            raise ConfigError(f"strategy.device_ids={ids} is not allowed: this machine has {gpus} GPUs "
                              f"(ids 0..{gpus - 1})")
        replicas = len(self._device_ids(self.options, self.trainer.cuda))
        # Each replica is a shallow copy of the module (replicate: its __dict__ copied), so what compile and
        # activation checkpointing put on the instance stays bound to the module on the first GPU, with its weights.
        for key, what in (("compile", "compiled code"), ("activation_checkpointing", "recomputed forward")):
            if getattr(self.trainer, key) and replicas > 1:
                raise ConfigError(
                    f"trainer.{key}=true is not allowed with strategy=dp on {replicas} GPUs: nn.DataParallel copies "
                    f"the module into every replica, and its {what} stays bound to the first GPU's weights; use "
                    f"strategy=ddp (one model per process), or trainer.{key}=false")

    def join(self) -> ProcessGroup:
        ids = self._device_ids(self.options, self.trainer.cuda)
        if not ids:
            print("strategy=dp: no GPU in use, so nn.DataParallel runs the model on the CPU (one replica)", flush=True)
            return LocalGroup(torch.device("cpu"))
        # DataParallel keeps the master copy on device_ids[0]; make it the current device so that pinned memory,
        # the current CUDA RNG and stray allocations never open a context on an excluded GPU.
        torch.cuda.set_device(ids[0])
        return LocalGroup(torch.device("cuda", ids[0]), [torch.device("cuda", i) for i in ids])

    def parallelize(self, model: nn.Module, make_optimizer, group: ProcessGroup) -> Wrapped:
        """On GPUs every replica runs as a Replica (the run's autocast dtype inside the replica's thread, a 0-dim
        output one value per sample); on the CPU the one replica is the module itself."""
        ids = group.cuda_devices
        outer = nn.DataParallel(Replica(model, autocast_dtype(self.trainer.precision)), device_ids=ids) if ids else model
        return DPWrapped(outer, make_optimizer(outer.parameters()), Precision(self.trainer.precision, group.device),
                         CheckpointIO(group.rank, group.world_size, ids), model,
                         replicas=len(group.devices))


class DPWrapped(Wrapped):
    """SlotSplit: the replicas a micro-batch runs on; OwnClock: each replica's forward and backward."""

    def __init__(self, *args, replicas: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.replicas = replicas

    def slot_sizes(self, micro_batch: int) -> list[int]:
        return chunk_sizes(micro_batch, self.replicas)

    def wait_clock(self, group: ProcessGroup) -> ReplicaClock:
        """OwnClock: every replica's forward and backward on its own GPU."""
        clock = ReplicaClock(group.devices)
        self.model.register_forward_pre_hook(lambda *_: clock.begin_micro_batch())  # before the replicas' own hooks
        time_replicas(self.model.module if isinstance(self.model, nn.DataParallel) else self.model, clock,
                      len(group.devices) > 1)
        return clock


class Replica(nn.Module):
    """What nn.DataParallel runs on each GPU, in a thread of its own:

    - the run's autocast dtype: DataParallel re-enters autocast in each replica's thread without a dtype, and a new
      thread's CUDA autocast dtype is fp16, so bf16 runs would train their replicas in fp16;
    - a 0-dim floating-point output (a HuggingFace model's `loss`: the mean over this replica's share of the batch) as
      that value for each of the share's samples: DataParallel's gather makes of the replicas' scalars a vector of one
      value per GPU ("the loss returned shape [2] for a batch of 16"), whereas shares of samples gather into one value
      per sample of the batch, whose mean weighs each replica by its share (as one GPU's loss would)."""

    def __init__(self, module: nn.Module, dtype: torch.dtype | None):
        super().__init__()
        self.module, self.dtype = module, dtype

    def forward(self, *args, **kwargs):
        if self.dtype is None:
            outputs = self.module(*args, **kwargs)
        else:
            device_type = next((a.device.type for a in leaves((args, kwargs))), "cuda")
            with torch.autocast(device_type, dtype=self.dtype):
                outputs = self.module(*args, **kwargs)
        return per_sample_scalars(outputs, batch_size(args, kwargs))


def per_sample_scalars(outputs, samples: int):
    """The output with each 0-dim floating-point tensor in it (itself, a value of a dict or ModelOutput, an item of a
    tuple or list) repeated for each of `samples`."""
    if torch.is_tensor(outputs):
        return outputs.expand(samples).contiguous() if outputs.dim() == 0 and outputs.is_floating_point() else outputs
    if isinstance(outputs, MutableMapping):  # in place: a ModelOutput keeps its class and its attributes
        for key in list(outputs.keys()):
            outputs[key] = per_sample_scalars(outputs[key], samples)
        return outputs
    if type(outputs) in (tuple, list):
        return type(outputs)(per_sample_scalars(o, samples) for o in outputs)
    return outputs


def chunk_sizes(batch: int, replicas: int) -> list[int]:
    """How nn.DataParallel scatters a batch over `replicas` GPUs: torch.chunk's ceil(batch / replicas) per replica,
    so a batch smaller than the GPUs (or one that divides badly: 10 over 8 is 5 chunks of 2) runs on fewer
    replicas, device_ids[:chunks]; the others get nothing and are not slots of the run."""
    if replicas <= 1:
        return [batch]
    return [len(c) for c in torch.arange(batch).chunk(replicas)]
