"""DistributedDataParallel: one process per GPU (or per CPU worker on gloo), started by torch's elastic agent, or by
an outer torchrun / scheduler that already started us; a torch.distributed group (ElasticStrategy,
framework/strategies/torch_distributed.py)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from framework.config.strategy_options import DDPOptions
from framework.common.errors import ConfigError
from framework.strategies.ddp_compression import GradientHook, gradient_hook
from framework.strategies.sync_batchnorm import convert_sync_batchnorm
from framework.strategies.torch_distributed import ElasticStrategy, refuse_bf16_reduce_without_support
from framework.training.checkpoint_io import CheckpointIO
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.precision import Precision


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

    def engine_state(self) -> dict:
        return self.comm_hook.state_dict()

    def load_engine_state(self, mine: dict | None, saved_world: int, world_size: int, step: int) -> str:
        return self.comm_hook.load_state_dict(mine, saved_world, world_size, step)


class DDPStrategy(ElasticStrategy):
    Options = DDPOptions
    options: DDPOptions
    muon_steps = "whole"  # tests/dist/test_muon.py

    def validate(self) -> None:
        super().validate()
        compression, cuda = self.options.compression, self.trainer.cuda
        if compression == "bf16" and self.on_nccl_gpus():
            refuse_bf16_reduce_without_support("none or fp16")
        if compression == "powersgd" and not cuda and torch.cuda.is_available():
            # powerSGD_hook.py: `if torch.cuda.is_available(): torch.cuda.synchronize(device)` with the bucket's
            # device, which for CPU workers is the CPU (ValueError: Expected a cuda device)
            raise ConfigError("strategy.compression=powersgd is not allowed with CPU workers on a machine with GPUs: "
                              "torch's PowerSGD hook synchronizes the bucket's device as a GPU whenever one is visible; "
                              "train on the GPUs, or hide them (CUDA_VISIBLE_DEVICES=)")

    def parallelize(self, model: nn.Module, make_optimizer, group: ProcessGroup) -> Wrapped:
        options = self.options
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
        # evaluation runs the module itself: ranks may hold different numbers of test batches, and DDP's forward
        # would wait on a buffer broadcast
        return DDPWrapped(ddp, make_optimizer(ddp.parameters()), Precision(self.trainer.precision, group.device),
                          CheckpointIO(group.rank, group.world_size, group.cuda_devices), module, eval_model=module,
                          comm_hook=hook)
