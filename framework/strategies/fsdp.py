"""FSDP2 (torch.distributed.fsdp.fully_shard): parameters, gradients and optimizer state sharded across ranks as
DTensors. Workers start and join exactly like ddp (torch's elastic agent, torchrun, SLURM); the model is sharded
in place, block by block, never DDP-wrapped. Checkpoints go through torch.distributed.checkpoint (DCP): every
rank writes its own shards, and DCP reshards them when the next run has another world size."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy
from torch.distributed.tensor import DTensor

from framework.checkpoints.position import Position
from framework.config.strategy_options import FSDPOptions
from framework.common.errors import ConfigError
from framework.models.blocks import auto_units, innermost_first, named_units
from framework.session.environment import Ranks
from framework.strategies.ddp import ElasticStrategy
from framework.strategies.fsdp_apply import ShardPrecision, shard_with_fsdp2
from framework.strategies.fsdp_units import tied_parameters, without_tied
from framework.strategies.fsdp_traffic import counted_reduce_scatters
from framework.strategies.fsdp_wire import WireDtype
from framework.training.checkpoint_io import CheckpointFormat, CheckpointIO
from framework.training.dcp import load_sharded, save_sharded, sharded_state
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.precision import Precision
from framework.training.speedups import SpeedupModules

DCP = CheckpointFormat("dcp", ("dcp", "file"), sharded=True, reshards=True)


class FSDPPrecision(Precision):
    """fully_shard's MixedPrecisionPolicy casts parameters for compute (and gradients for reduction), so no
    autocast runs on top. Gradients are DTensors: the clipping norm comes back as one and is made a plain,
    global number (every rank sees the same one and makes the same skip decision)."""

    def autocast(self):
        return contextlib.nullcontext()

    def clip_grad_norm(self, model, optimizer, max_norm):
        norm = super().clip_grad_norm(model, optimizer, max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm


class FSDPWrapped(Wrapped):
    """GradientSync: non-final micro-batches of an accumulation keep their gradients local and unsharded (no
    reduce-scatter); with reshard_after_forward=false (memory traded for speed) the parameters also stay unsharded
    until the last micro-batch, so its forward gathers nothing again."""

    def __init__(self, *args, reshard_after_forward: bool, traffic=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.reshard_after_forward = reshard_after_forward
        self.traffic = traffic  # CountsTraffic: its reduce-scatters' bytes (framework/strategies/fsdp_traffic.py)

    def gradient_sync(self, on: bool):
        self.model.set_requires_gradient_sync(on)
        if not self.reshard_after_forward:
            self.model.set_reshard_after_backward(on)
        return contextlib.nullcontext()


class FSDPStrategy(ElasticStrategy):
    Options = FSDPOptions
    options: FSDPOptions
    channels_last_refusal = "fully_shard only shards contiguous parameters, and channels_last conv weights are not"
    # fully_shard moves one unit at a time to the GPU and keeps only its shard there (or in CPU memory, with
    # cpu_offload): a model larger than one GPU never sits there whole
    moves_model_itself = True
    _describe_note = "; parameters, gradients and optimizer state sharded by fully_shard"

    def __init__(self, options: FSDPOptions, trainer, ranks: Ranks | None):
        super().__init__(options, trainer, ranks, DCP)

    def backend_for(self, options: FSDPOptions, cuda: bool) -> str:
        """With cpu_offload the sharded gradients live in CPU memory, and clipping and the non-finite check
        all-reduce them there: the group needs gloo for CPU tensors beside nccl for CUDA ones (pytorch#148532)."""
        backend = super().backend_for(options, cuda)
        if options.cpu_offload and cuda and backend == "nccl":
            return "cpu:gloo,cuda:nccl"
        return backend

    def validate(self) -> None:
        super().validate()
        if self.options.cpu_offload and not self.trainer.cuda:
            raise ConfigError("strategy.cpu_offload=true is not allowed without GPUs: the parameters and optimizer "
                              "state already live in CPU memory; use strategy.cpu_offload=false")
        if self.trainer.precision == "fp16":
            raise ConfigError("trainer.precision=fp16 is not allowed with strategy=fsdp: fp16 needs a loss scaler "
                              "that unscales sharded (DTensor) gradients and agrees on overflows across ranks, which "
                              "torch.amp.GradScaler does not; use bf16 (no loss scaling needed) or fp32")

    def check_model(self, model: nn.Module) -> None:
        names = self.options.shard_class_names
        if names is None:
            return
        present = {type(m).__name__ for m in model.modules() if m is not model}
        missing = [n for n in names if n not in present]
        if missing:
            raise ConfigError(f"strategy.shard_modules={names} is not allowed: {type(model).__name__} has no submodule "
                              f"of class {', '.join(missing)}; its submodule classes are {', '.join(sorted(present))}")
        tied = tied_parameters(model, named_units(model, names))
        if tied:
            shared = "; ".join(" = ".join(n) for n in tied.values())
            raise ConfigError(f"strategy.shard_modules={names} is not allowed for {type(model).__name__}: tied "
                              f"parameters ({shared}) would live in two units, and fully_shard needs each parameter in "
                              "one; list classes that keep them together, or use strategy.shard_modules=auto (which "
                              "leaves tied modules to the root)")

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        """The modules sharded (and all-gathered) as one unit each, innermost first; the root comes last
        (framework/strategies/fsdp_units.py: containers are descended into, tied parameters stay in one unit)."""
        names = self.options.shard_class_names
        units = auto_units(model) if names is None else named_units(model, names)
        return innermost_first(model, without_tied(model, units))

    def speedup_modules(self, model: nn.Module) -> SpeedupModules:
        """Each unit recomputed (fully_shard's hooks stay outside the recomputed forward) and compiled on its own
        before fully_shard (torchtitan's way): the all-gathers between units stay in fully_shard's eager hooks, which
        one graph of the whole model would have to trace."""
        units = self.shard_units(model)
        return SpeedupModules(recomputed=units, compiled=units)

    def parallelize(self, model: nn.Module, make_optimizer, group: ProcessGroup) -> Wrapped:
        options = self.options
        offload = CPUOffloadPolicy() if options.cpu_offload else OffloadPolicy()
        # The mesh names this run's device: fully_shard's default is the machine's accelerator, which would put a
        # trainer.accelerator=cpu run on a GPU machine onto the GPU.
        mesh = init_device_mesh(group.device.type, (group.world_size,))
        # bf16 parameters for compute, gradients reduced and held in fp32 (the sharded fp32 master copy is what
        # steps); strategy.compression=bf16 casts them for the wire only (framework/strategies/fsdp_wire.py)
        shard_with_fsdp2(model, self.shard_units(model), mesh, ShardPrecision.of(self.trainer.precision),
                         options.reshard_after_forward, offload)
        wire = WireDtype(torch.bfloat16) if options.compression == "bf16" else None
        traffic = counted_reduce_scatters(model, options.compression, wire)
        return FSDPWrapped(model, make_optimizer(model.parameters()), FSDPPrecision(self.trainer.precision, group.device),
                           DcpCheckpoints(group.rank, group.world_size, group.cuda_devices, options.cpu_offload), model,
                           reshard_after_forward=options.reshard_after_forward, traffic=traffic)


class DcpCheckpoints(CheckpointIO):
    """torch.distributed.checkpoint: one shard per rank; reads a single-file checkpoint (single, ddp, dp) as a full
    state dict, each rank keeping its shards."""

    format = DCP

    def __init__(self, rank: int, world_size: int, cuda_devices: list[int], cpu_offload: bool):
        super().__init__(rank, world_size, cuda_devices)
        self.cpu_offload = cpu_offload

    def full_model_state(self, module: nn.Module) -> dict | None:
        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.is_main else None

    def save_shards(self, folder: Path, tag: str, model: nn.Module, optimizer) -> None:
        save_sharded(self.shard_state(model, optimizer), folder / tag)

    def shard_state(self, model: nn.Module, optimizer) -> dict:
        return sharded_state(model, optimizer)

    def load_shards(self, folder: Path, tag: str, model: nn.Module, optimizer) -> None:
        """DCP reads the shards this rank needs under this run's sharding, whatever world size wrote them."""
        load_sharded(model, optimizer, folder / tag)

    def restore_file(self, state: dict, module: nn.Module, optimizer, scaler) -> tuple[Position, dict]:
        """A single-file checkpoint holds the full model and a plain optimizer state dict (parameters by index, in
        model.parameters() order)."""
        names = [name for name, _ in module.named_parameters()]
        saved = state["optimizer"]
        by_name = {
            "state": {names[i]: s for i, s in saved["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]],
        }
        with _buffers_in_cpu_memory(module, self.cpu_offload):
            set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=by_name,
                           options=StateDictOptions(full_state_dict=True))
        return self.progress(state)


@contextlib.contextmanager
def _buffers_in_cpu_memory(model: nn.Module, offloaded: bool):
    """With cpu_offload the parameters' shards live in CPU memory while buffers (BatchNorm's statistics) stay on the
    GPU, and loading a full state dict refuses a model on two devices ("Multiple devices found"): the buffers join
    the parameters in CPU memory for the load and go back afterwards."""
    buffers = list(model.buffers()) if offloaded else []
    devices = [b.device for b in buffers]
    for b in buffers:
        b.data = b.data.cpu()
    try:
        yield
    finally:
        for b, device in zip(buffers, devices):
            b.data = b.data.to(device)
