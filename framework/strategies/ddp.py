"""DistributedDataParallel: one process per GPU (or per CPU worker on gloo), started by torch's elastic agent, or by
an outer torchrun / scheduler that already started us; a torch.distributed group (what fsdp and deepspeed share:
ElasticStrategy)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from framework.config.strategy_options import DDPOptions, ElasticOptions
from framework.common.errors import ConfigError
from framework.session.environment import Ranks
from framework.strategies.base import Strategy
from framework.strategies.ddp_compression import GradientHook, gradient_hook
from framework.strategies.groups import TorchGroup
from framework.strategies.starters import Elastic, Preload
from framework.strategies.sync_batchnorm import convert_sync_batchnorm
from framework.training.checkpoint_io import FILE, CheckpointFormat, CheckpointIO
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.precision import Precision


class ElasticStrategy(Strategy):
    """Workers started and joined like ddp's: torch's elastic agent (or an outer torchrun / SLURM), one process per
    GPU or CPU worker, a torch.distributed group. Subclasses say what parallelize() makes."""

    Options = ElasticOptions
    options: ElasticOptions
    outer_kinds = Elastic.outer_kinds
    _describe_note = ""  # what the engine adds to the starter's line in hydra-dist-devices
    _worker_modules: tuple[str, ...] = ()  # the engine's own modules, imported once in the worker template
    # where more workers than GPUs are asked for, whether gloo (several workers per GPU) is a way out to suggest
    gloo_shares_gpus = True

    def __init__(self, options: ElasticOptions, trainer, ranks: Ranks | None,
                 checkpoint_format: CheckpointFormat = FILE):
        starter = Elastic(options, trainer.cuda, self.backend_for(options, trainer.cuda), trainer.log_all_ranks, ranks,
                          self._describe_note, Preload(self._worker_modules, self._worker_environment(trainer.cuda)))
        super().__init__(options, trainer, starter, checkpoint_format)

    def _worker_environment(self, cuda: bool) -> dict[str, str]:
        """Variables the engine's own modules read when imported (in the worker template)."""
        return {}

    def backend_for(self, options: ElasticOptions, cuda: bool) -> str:
        return ("nccl" if cuda else "gloo") if options.backend == "auto" else options.backend

    @property
    def backend(self) -> str:
        return self.starter.backend

    def validate(self) -> None:
        stall = self.trainer.stall_timeout
        if stall is not None and self.options.timeout <= stall:
            raise ConfigError(f"strategy.timeout={self.options.timeout:g} must be longer than trainer.stall_timeout="
                              f"{stall:g}: the stall watchdog names the stalled rank before the process group gives "
                              f"up; raise strategy.timeout (or lower trainer.stall_timeout)")
        if self.options.backend == "nccl" and not self.trainer.cuda:
            raise ConfigError("strategy.backend=nccl is not allowed without GPUs: nccl needs CUDA; use "
                              "strategy.backend=gloo (or auto) for CPU workers")
        if self.trainer.cuda and "nccl" in self.backend:
            self._validate_one_gpu_per_worker()
            if getattr(self.options, "compression", "none") == "bf16" and not _nccl_reduces_bf16():
                raise ConfigError("strategy.compression=bf16 is not allowed on these GPUs: gradients reduced in bf16 "
                                  "need GPUs with bf16 (torch.cuda.is_bf16_supported) and NCCL >= 2.10; use "
                                  "strategy.compression=none (ddp: or fp16)")

    def _validate_one_gpu_per_worker(self) -> None:
        """nccl refuses two ranks on one GPU ("Duplicate GPU detected"), and each worker takes GPU local_rank modulo
        the GPUs it sees. Under SLURM/submitit each task may see GPUs of its own (--gpus-per-task), so only torch's
        launchers, whose workers all see the node's GPUs, are counted here."""
        gpus, workers, outer = torch.cuda.device_count(), self.starter.nproc_per_node(), self.starter.ranks
        if outer is None:
            if workers > gpus:
                raise ConfigError(
                    f"strategy.nproc_per_node={workers} is not allowed with nccl: this machine has {gpus} GPU(s) and "
                    f"nccl needs one GPU per worker; use at most {gpus}" + self._gloo_hint())
        elif outer.scheduler is None and workers > gpus:
            raise ConfigError(
                f"strategy={self.name} with nccl is not allowed with {workers} workers on this node: the launcher "
                f"started them (LOCAL_WORLD_SIZE={workers}) and the node shows each of them {gpus} GPU(s), so two "
                "workers would share a GPU, which nccl refuses; start at most {gpus} per node (torchrun "
                "--nproc-per-node)".replace("{gpus}", str(gpus)) + self._gloo_hint())

    def _gloo_hint(self) -> str:
        return ", or strategy.backend=gloo" if self.gloo_shares_gpus else ""

    def join(self) -> ProcessGroup:
        return TorchGroup.join(self.starter.ranks, self.backend, self.trainer.cuda, self.options.timeout)


@dataclass
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

    def engine_state(self, group: ProcessGroup) -> list:
        return self.comm_hook.gathered_state(group)

    def load_engine_state(self, saved: list | None, rank: int, world_size: int, step: int) -> str:
        return self.comm_hook.load_state_dict(saved, rank, world_size, step)


class DDPStrategy(ElasticStrategy):
    Options = DDPOptions
    options: DDPOptions

    def validate(self) -> None:
        super().validate()
        compression, cuda = self.options.compression, self.trainer.cuda
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


def _nccl_reduces_bf16() -> bool:
    return torch.cuda.is_bf16_supported(including_emulation=False) and torch.cuda.nccl.version() >= (2, 10)
