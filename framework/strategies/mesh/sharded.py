"""Every mesh but the 1-D replicate one (strategy=fsdp, hsdp, tp, pp): parameters as DTensors, FSDP2 over the
data-parallel axes where there are any (bf16 by its MixedPrecisionPolicy; framework/strategies/mesh/fsdp.py), tensor
parallel's and the pipeline's pieces, all placed in CPU memory and then what is left moved to the device; a
precision that clips over the whole mesh; DCP checkpoints under the whole model's names."""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

from framework.common.errors import ConfigError
from framework.config.strategy_options import MeshOptions
from framework.config.trainer import EngineSettings
from framework.models.blocks import auto_units, holds_parameters
from framework.session.environment import Ranks
from framework.strategies.mesh.comm_clock import CommClock, timed_by_default
from framework.strategies.mesh.checkpoints import DCP, MeshCheckpoints
from framework.strategies.mesh.dims import MeshDims, MeshGroup
from framework.strategies.mesh.foreach import per_tensor_where_mixed
from framework.strategies.mesh.fsdp import ShardPrecision, check_shard_modules, shard_units, shard_with_fsdp2
from framework.strategies.mesh.fsdp_traffic import counted_reduce_scatters
from framework.strategies.mesh.fsdp_wire import WireDtype
from framework.strategies.mesh.parallelize import parallelize
from framework.strategies.mesh.pipeline_cut import blocks, stage_pieces, stage_ranks
from framework.strategies.mesh.pipeline_run import Pipeline, PipelineRunner, PipelineWrapped
from framework.strategies.mesh.precision import MeshPrecision
from framework.strategies.mesh.tensor_parallel import check_outputs_kept, check_plan
from framework.strategies.mesh.tied import TiedGradients, tied_on_one_rank
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.speedups import SpeedupModules


class Sharded:
    """The mesh's data parallel beside other axes, or sharded (mesh/engine.py: data_parallel_for): what differs from
    DDP's 1-D replicate mesh (mesh/ddp.py), each answered once."""

    checkpoint_format = DCP
    gloo_shares_gpus = False  # the mesh's collectives run on CUDA tensors: nccl
    other_compressions = "none"
    channels_last_refusal = ("fully_shard and DTensor shard contiguous parameters, and channels_last conv weights "
                             "are not")
    # a pipeline rank puts only its own stages on its device; fully_shard one unit at a time (and with cpu_offload
    # only its shard): a model larger than one GPU never sits there whole
    moves_model_itself = True

    def __init__(self, options: MeshOptions, trainer: EngineSettings):
        self.options, self.trainer = options, trainer
        self.describe_note = ("; parameters, gradients and optimizer state sharded by fully_shard"
                              if options.tp == options.pp == 1 else
                              "; one device mesh (tensor and pipeline parallel, FSDP2 over the data-parallel axes)")

    def muon_steps(self, dims: MeshDims) -> str:
        return "shards" if dims.tp > 1 or dims.dp_shard > 1 else "unproven"

    def validate(self) -> None:
        o, t = self.options, self.trainer
        if o.cpu_offload and not t.cuda:
            raise ConfigError("strategy.cpu_offload=true is not allowed without GPUs: the parameters and optimizer "
                              "state already live in CPU memory; use strategy.cpu_offload=false")
        if t.precision == "fp16":
            raise ConfigError(f"trainer.precision=fp16 is not allowed with strategy={o.name}: fp16 needs a loss "
                              "scaler for DTensor gradients across the mesh, which torch.amp.GradScaler is not; use "
                              "bf16 (no loss scaling needed) or fp32 (or strategy=ddp, which scales fp16 losses)")

    def check_model(self, model: nn.Module, dims: MeshDims) -> None:
        o = self.options
        if o.shard_class_names is not None:
            check_shard_modules(model, o.shard_class_names)
        if o.tp > 1:
            check_plan(model, o)
        if o.pp > 1 and dims.sharded:
            self._check_ties_on_one_rank(model, stage_pieces(model, o.pp * o.virtual_stages, o.split_points))

    def check_task(self, model: nn.Module, example) -> None:
        if self.options.tp > 1:
            check_outputs_kept(model, self.options, example)

    def _check_ties_on_one_rank(self, model: nn.Module, stages: list[list[str]]) -> None:
        o = self.options
        found = tied_on_one_rank(model, stages, stage_ranks(len(stages), o.pp, o.schedule))
        if found is None:
            return
        tie, shared = found
        axes = " and ".join(f"strategy.{k}={getattr(o, k)}" for k in ("dp_replicate", "dp_shard") if getattr(o, k) > 1)
        raise ConfigError(f"strategy.schedule={o.schedule} is not allowed with {axes} for {type(model).__name__}: "
                          f"its stages {' and '.join(map(str, shared))}, both on one pipeline rank, share "
                          f"{' and '.join(tie.names)} (one tied parameter), and FSDP2 would shard each stage's copy "
                          "as a parameter of its own, trained apart; use a schedule or split points that put them on "
                          "two ranks (strategy.schedule=InterleavedZeroBubble for ZBVZeroBubble), or no data-parallel "
                          "axis (strategy.dp_shard=1 strategy.dp_replicate=1)")

    def join(self, ranks: Ranks, backend: str, timeout_s: float, dims: MeshDims) -> MeshGroup:
        return MeshGroup.join(ranks, backend, self.trainer.cuda, timeout_s).on_mesh(dims)

    def speedup_modules(self, model: nn.Module) -> SpeedupModules:
        """FSDP2 alone: each of its units recomputed (fully_shard's hooks stay outside the recomputed forward) and
        compiled on its own before fully_shard (torchtitan's way: the all-gathers between units stay in its eager
        hooks). Tensor and pipeline parallel: the blocks holding parameters, one by one (on a pipeline rank, those of
        its own stages; a Sequential's activations and poolings are left to the layers around them)."""
        o = self.options
        if o.tp == o.pp == 1:
            units = shard_units(model, o.shard_class_names)
            return SpeedupModules(recomputed=units, compiled=units)
        units = [m for m in (model.get_submodule(name) for name in blocks(model)) if holds_parameters(m)]
        units = units or auto_units(model)
        return SpeedupModules(recomputed=units, compiled=units)

    def wrap(self, model: nn.Module, make_optimizer, group: MeshGroup) -> Wrapped:
        """The pipeline cut and tensor parallel (mesh/parallelize.py), then FSDP2 on each of this rank's stages while
        they are still in CPU memory (fully_shard each unit as it shards it, so no GPU ever holds a whole stage in
        fp32: a model.to(device) first would), then the rest moved, the optimizer, the precision and the checkpoints
        over the whole mesh."""
        o, dims, coords = self.options, group.dims, group.coords
        stages = parallelize(model, o, group)
        if dims.sharded:
            offload = CPUOffloadPolicy() if o.cpu_offload else OffloadPolicy()
            for part in stages.parts.values():
                # pipeline stages keep parameters gathered between their micro-batches' forward and backward (as
                # torchtitan does: resharding would gather them again for every micro-batch)
                shard_with_fsdp2(part, shard_units(part, o.shard_class_names), group.dp_mesh(),
                                 ShardPrecision.of(self.trainer.precision),
                                 reshard_after_forward=o.reshard_after_forward and o.pp == 1, offload=offload)
        model.to(group.device)  # what tensor parallel and FSDP2 left: plain parameters, buffers
        named = list(model.named_parameters())
        params = [p for _, p in named]
        pp_group = group.axis("pp").get_group() if o.pp > 1 else None
        tied = TiedGradients(stages.ties, model, dims, group.rank, pp_group)
        # autocast where FSDP2 does not cast; clipping over DTensor gradients and pipeline stages
        precision = MeshPrecision(self.trainer.precision, group.device, params, dims.sharded, tied, pp_group)
        gathers = coords["dp_replicate"] == coords["dp_shard"] == coords["tp"] == 0
        io = MeshCheckpoints(group, model, stages.whole, tied.canonical, gathers=gathers, cpu_offload=o.cpu_offload)
        # the stage's parameters, tensor parallel's DTensors among them, by the whole model's names (a tied copy by
        # the name the whole model has it under): what optimizer.param_groups' patterns match
        optimizer = make_optimizer(params, names=[tied.canonical.get(name, name) for name, _ in named])
        per_tensor_where_mixed(optimizer)
        # strategy.compression=bf16: cast for the wire only (framework/strategies/mesh/fsdp_wire.py)
        wire = WireDtype(torch.bfloat16) if o.compression == "bf16" else None
        traffic = counted_reduce_scatters(model, o.compression, wire) if dims.sharded else None
        if o.pp == 1:
            timed = timed_by_default(o.comm_clock, group.device)
            return MeshWrapped(model, optimizer, precision, io, model, fsdp=dims.sharded, traffic=traffic,
                               reshard_after_forward=o.reshard_after_forward, timed=timed)
        runner = PipelineRunner(stages.parts, stages.holders, o, coords["pp"], pp_group, group.device,
                                precision=precision)
        runner.measure_links()
        return PipelineWrapped(Pipeline(runner), optimizer, precision, io, model, runner=runner, traffic=traffic)


class MeshWrapped(Wrapped):
    """Tensor parallel and FSDP2 (no pipeline). GradientSync where FSDP2 runs: an accumulation's non-final
    micro-batches keep their gradients unreduced and unsharded; with reshard_after_forward=false (memory traded for
    speed) the parameters also stay unsharded until the last micro-batch, so its forward gathers nothing again."""

    def __init__(self, *args, fsdp: bool, reshard_after_forward: bool, timed: bool, traffic=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fsdp, self.reshard_after_forward, self.timed = fsdp, reshard_after_forward, timed
        self.traffic = traffic  # CountsTraffic: FSDP2's reduce-scatters, where they carry every gradient
        self.comm_clock = None  # OwnClock: every micro-batch's collectives (mesh/comm_clock.py)

    def gradient_sync(self, on: bool):
        if self.fsdp:
            self.model.set_requires_gradient_sync(on)
            if not self.reshard_after_forward:
                self.model.set_reshard_after_backward(on)
        return self.comm_clock.timing() if self.comm_clock else contextlib.nullcontext()

    def wait_clock(self, group: ProcessGroup) -> CommClock | None:
        """strategy.comm_clock: None where the collectives go untimed (the loop then measures no wait)."""
        self.comm_clock = CommClock(group.device) if self.timed else None
        return self.comm_clock
