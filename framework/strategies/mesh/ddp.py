"""The 1-D replicate mesh (dp_replicate alone, strategy=ddp): DistributedDataParallel itself, with its gradient
buckets, communication hooks (strategy.compression: fp16, bf16, PowerSGD; framework/strategies/mesh/ddp_hooks.py),
no_sync, fp16's GradScaler and SyncBatchNorm. Evaluation runs the module itself: ranks may hold different numbers of
test batches, and DDP's forward would wait on a buffer broadcast."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from torch import nn

from framework.config.strategy_options import MeshOptions
from framework.strategies.mesh.ddp_hooks import GradientHook, gradient_hook
from framework.strategies.mesh.sync_batchnorm import convert_sync_batchnorm
from framework.telemetry.wait_clock import WaitClock
from framework.training.checkpoint_io import CheckpointIO
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.precision import Precision


@dataclass(kw_only=True)
class DDPWrapped(Wrapped):
    """GradientSync: a micro-batch that is not the last of an accumulation keeps its gradients local (no_sync).
    CountsTraffic, OwnClock and EngineState: its communication hook (strategy.compression) counts the bytes it sends and keeps
    PowerSGD's state, which checkpoints hold."""

    comm_hook: GradientHook | None = None

    def gradient_sync(self, on: bool):
        return contextlib.nullcontext() if on else self.model.no_sync()

    @property
    def traffic(self):
        return self.comm_hook.traffic

    def wait_clock(self, group: ProcessGroup) -> WaitClock:
        """OwnClock: the comm hook sees each bucket become ready; the last micro-batch's backward releases the rank."""
        self.comm_hook.clock = WaitClock(group.device, ends_with_backward=True)
        return self.comm_hook.clock

    def engine_state(self) -> dict:
        return self.comm_hook.state_dict()

    def load_engine_state(self, mine: dict | None, saved_world: int, world_size: int, step: int) -> str:
        return self.comm_hook.load_state_dict(mine, saved_world, world_size, step)


def wrap_with_ddp(model: nn.Module, make_optimizer, group: ProcessGroup, options: MeshOptions,
                  precision: Precision) -> DDPWrapped:
    if options.sync_batchnorm:
        model = convert_sync_batchnorm(model, group.device)
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[group.device.index] if group.device.type == "cuda" else None,
        find_unused_parameters=options.find_unused_parameters, bucket_cap_mb=options.bucket_cap_mb,
        gradient_as_bucket_view=options.gradient_as_bucket_view, static_graph=options.static_graph,
    )
    module = ddp.module
    hook = GradientHook(options.compression, options.powersgd, list(module.parameters()))
    ddp.register_comm_hook(hook, gradient_hook)
    return DDPWrapped(ddp, make_optimizer(ddp.parameters()), precision,
                      CheckpointIO(group.rank, group.world_size, group.cuda_devices), module, eval_model=module,
                      comm_hook=hook)
