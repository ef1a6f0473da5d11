"""The 1-D replicate mesh (dp_replicate alone, strategy=ddp): DistributedDataParallel itself, with its gradient
buckets, communication hooks (strategy.compression: fp16, bf16, PowerSGD; framework/strategies/mesh/ddp_hooks.py),
no_sync, fp16's GradScaler and SyncBatchNorm, and one-file checkpoints. Evaluation runs the module itself: ranks may
hold different numbers of test batches, and DDP's forward would wait on a buffer broadcast."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from framework.common.errors import ConfigError
from framework.config.strategy_options import MeshOptions
from framework.config.trainer import EngineSettings
from framework.models.blocks import auto_units
from framework.session.environment import Ranks
from framework.strategies.groups import TorchGroup
from framework.strategies.mesh.ddp_hooks import GradientHook, gradient_hook
from framework.strategies.mesh.sync_batchnorm import convert_sync_batchnorm
from framework.telemetry.wait_clock import WaitClock
from framework.training.checkpoint_io import FILE, CheckpointIO
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.precision import Precision
from framework.training.speedups import SpeedupModules


class DDP:
    """The mesh's data parallel where it is the only axis (mesh/engine.py: data_parallel_for): what differs from the
    sharded meshes (mesh/sharded.py), each answered once."""

    checkpoint_format = FILE
    gloo_shares_gpus = True  # gloo on GPUs: several workers may share one
    other_compressions = "none or fp16"  # where these GPUs refuse compression=bf16
    channels_last_refusal = None
    moves_model_itself = False
    describe_note = ""

    def __init__(self, options: MeshOptions, trainer: EngineSettings):
        self.options, self.trainer = options, trainer

    def muon_steps(self, dims) -> str:
        return "whole"  # tests/dist/test_muon.py

    def validate(self) -> None:
        if self.options.compression == "powersgd" and not self.trainer.cuda and torch.cuda.is_available():
            # powerSGD_hook.py: `if torch.cuda.is_available(): torch.cuda.synchronize(device)` with the bucket's
            # device, which for CPU workers is the CPU (ValueError: Expected a cuda device)
            raise ConfigError("strategy.compression=powersgd is not allowed with CPU workers on a machine with "
                              "GPUs: torch's PowerSGD hook synchronizes the bucket's device as a GPU whenever one "
                              "is visible; train on the GPUs, or hide them (CUDA_VISIBLE_DEVICES=)")

    def check_model(self, model: nn.Module, dims) -> None:
        """DDP takes any model: the plan, the shard units and the stages are the sharded side's."""

    def check_task(self, model: nn.Module, example) -> None:
        """DDP runs any forward: the plan's split outputs are the sharded side's."""

    def join(self, ranks: Ranks, backend: str, timeout_s: float, dims) -> TorchGroup:
        """The default group: DDP needs no DeviceMesh."""
        return TorchGroup.join(ranks, backend, self.trainer.cuda, timeout_s)

    def speedup_modules(self, model: nn.Module) -> SpeedupModules:
        """The blocks recomputed, the whole model compiled inside DDP."""
        return SpeedupModules(recomputed=auto_units(model), compiled=[model])

    def wrap(self, model: nn.Module, make_optimizer, group: ProcessGroup) -> DDPWrapped:
        o = self.options
        if o.sync_batchnorm:
            model = convert_sync_batchnorm(model, group.device)
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=[group.device.index] if group.device.type == "cuda" else None,
            find_unused_parameters=o.find_unused_parameters, bucket_cap_mb=o.bucket_cap_mb,
            gradient_as_bucket_view=o.gradient_as_bucket_view, static_graph=o.static_graph,
        )
        module = ddp.module
        hook = GradientHook(o.compression, o.powersgd, list(module.parameters()))
        ddp.register_comm_hook(hook, gradient_hook)
        return DDPWrapped(ddp, make_optimizer(ddp.parameters()), Precision(self.trainer.precision, group.device),
                          CheckpointIO(group.rank, group.world_size, group.cuda_devices), module, eval_model=module,
                          comm_hook=hook)


@dataclass(kw_only=True)
class DDPWrapped(Wrapped):
    """GradientSync: a micro-batch that is not the last of an accumulation keeps its gradients local (no_sync).
    CountsTraffic and EngineState: its communication hook (strategy.compression) counts the bytes it sends and keeps
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
