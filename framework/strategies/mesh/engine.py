"""The mesh engine (strategy=ddp, fsdp, hsdp, tp, pp: presets of its degrees): workers start and join like torchrun's,
build one DeviceMesh of the degrees dp_replicate x dp_shard x tp x pp, and parallelize() makes of the model, in
torchtitan's order: the pipeline stages this rank holds (the other stages' pieces dropped), tensor parallel by the
plan, activation checkpointing and compile (the blocks, from framework/assemble.py's speed-ups, which wrap lazily:
they take effect around the parallelized blocks), FSDP2 over the data-parallel axes (bf16 by its
MixedPrecisionPolicy; framework/strategies/mesh/fsdp_apply.py), all in CPU memory, then what is left moved to the device.
The 1-D replicate mesh (dp_replicate alone) is DDP itself instead (mesh/ddp.py), with one-file checkpoints;
every other mesh writes DCP. The loop runs as for any engine: a Wrapped whose precision clips over the whole mesh,
whose checkpoints are DCP under the whole model's names, and, for pipeline parallel, which runs forward and backward
itself (OwnsForwardBackward) and times its stages (OwnClock)."""
from __future__ import annotations

import contextlib
import dataclasses
import re

import torch
import torch.distributed.config as dist_config
from torch import nn

from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

from framework.common.errors import ConfigError
from framework.config.strategy_options import MULTI_STAGE, REST_OF_THE_WORLD, ZERO_BUBBLE, MeshOptions
from framework.data.streams import is_stream, shards_itself
from framework.models.blocks import auto_units, holds_parameters, innermost_first, named_units
from framework.session.environment import Ranks
from framework.strategies.mesh.comm_clock import CommClock
from framework.strategies.mesh.dcp_checkpoints import DCP
from framework.strategies.mesh.fsdp_apply import ShardPrecision, shard_with_fsdp2
from framework.strategies.mesh.fsdp_traffic import counted_reduce_scatters
from framework.strategies.mesh.fsdp_units import tied_parameters, without_tied
from framework.strategies.mesh.fsdp_wire import WireDtype
from framework.strategies.groups import TorchGroup
from framework.strategies.mesh.checkpoints import MeshCheckpoints, WholeModel
from framework.strategies.mesh.ddp import wrap_with_ddp
from framework.strategies.mesh.foreach import per_tensor_where_mixed
from framework.strategies.mesh.group import MeshGroup
from framework.strategies.mesh.pipeline_cut import (blocks, changes_its_input, check_stages,
                                                              copy_input_first, cut, pieces, stage_pieces,
                                                              stage_ranks, view)
from framework.strategies.mesh.pipeline_run import PipelineRunner
from framework.strategies.mesh.precision import MeshPrecision
from framework.strategies.mesh.shape import MeshShape
from framework.strategies.mesh.tensor_parallel import apply_tensor_parallel, check_plan
from framework.strategies.mesh.tied import TiedGradients, find_ties, tied_on_one_rank
from framework.strategies.torch_distributed import ElasticStrategy, refuse_bf16_reduce_without_support
from framework.training.checkpoint_io import FILE
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.precision import Precision
from framework.training.speedups import SpeedupModules


# pyproject allows torch >= 2.4 for ddp and fsdp; tensor and pipeline parallel's APIs are newer, and this is the torch
# their tests ran
TESTED_TORCH = (2, 14)


def release(version: str) -> tuple[int, ...]:
    """A torch version's release numbers: NVIDIA's containers and nightlies build `2.14.0a0+sha`, which PEP 440
    sorts before 2.14 although it holds 2.14's APIs."""
    leading = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in leading.group().split(".")[:len(TESTED_TORCH)]) if leading else ()


class MeshStrategy(ElasticStrategy):
    Options = MeshOptions
    options: MeshOptions

    def __init__(self, options: MeshOptions, trainer, ranks: Ranks | None):
        if not options.runs_ddp:
            self.channels_last_refusal = ("fully_shard and DTensor shard contiguous parameters, and channels_last "
                                          "conv weights are not")
            # a pipeline rank puts only its own stages on its device; fully_shard one unit at a time (and with
            # cpu_offload only its shard): a model larger than one GPU never sits there whole
            self.moves_model_itself = True
            self._describe_note = ("; parameters, gradients and optimizer state sharded by fully_shard"
                                   if options.tp == options.pp == 1 else
                                   "; one device mesh (tensor and pipeline parallel, FSDP2 over the data-parallel axes)")
        # a degree of -1: the starter's workers decide (one per GPU, or 2 on the CPU), not the degrees
        unfilled = REST_OF_THE_WORLD in self._shape(options).sizes
        if options.nproc_per_node is None and not trainer.cuda and ranks is None and not unfilled:
            # on the CPU the mesh says how many gloo workers to start (on GPUs: one per GPU, checked in validate)
            workers = self._shape(options).workers
            options = dataclasses.replace(options, nproc_per_node=max(1, workers // options.nnodes))
        super().__init__(options, trainer, ranks, FILE if options.runs_ddp else DCP)

    def backend_for(self, options: MeshOptions, cuda: bool) -> str:
        """With cpu_offload the sharded gradients live in CPU memory, and clipping and the non-finite check
        all-reduce them there: the group needs gloo for CPU tensors beside nccl for CUDA ones (pytorch#148532)."""
        backend = super().backend_for(options, cuda)
        if options.cpu_offload and cuda and backend == "nccl":
            return "cpu:gloo,cuda:nccl"
        return backend

    @property
    def gloo_shares_gpus(self) -> bool:
        """DDP takes gloo on GPUs (several workers per GPU); the mesh's collectives run on CUDA tensors: nccl."""
        return self.options.runs_ddp

    @staticmethod
    def _shape(o: MeshOptions) -> MeshShape:
        return MeshShape(pp=o.pp, dp_replicate=o.dp_replicate, dp_shard=o.dp_shard, tp=o.tp)

    @property
    def shape(self) -> MeshShape:
        """The degrees, a -1 among them made the rest of the world (the workers the starter starts or was given)."""
        return self._shape(self.options).filled(self.starter.processes())

    def batch_shares(self) -> int:
        return self.shape.dp_size

    @property
    def muon_steps(self) -> str:
        if self.options.runs_ddp:
            return "whole"  # tests/dist/test_muon.py
        return "shards" if self.shape.tp > 1 or self.shape.dp_shard > 1 else "unproven"

    # ---- the driver -----------------------------------------------------------------------------------------
    def validate(self) -> None:
        o, t, shape = self.options, self.trainer, self.shape
        if (o.tp > 1 or o.pp > 1) and release(torch.__version__) < TESTED_TORCH:
            tested = ".".join(map(str, TESTED_TORCH))
            raise ConfigError(f"strategy={self.name} is not allowed with torch {torch.__version__}: the mesh engine "
                              f"needs torch >= {tested}, what it is tested with (torch.distributed.pipelining's "
                              "pre-split micro-batches and zero-bubble schedules, DTensor's norms); pip install "
                              f"'torch>={tested}' (ddp, fsdp and the other strategies take torch >= 2.4)")
        if t.cuda and "nccl" not in self.backend and not o.runs_ddp:
            raise ConfigError(f"strategy.backend={o.backend} is not allowed with strategy={self.name} on GPUs: the "
                              "mesh's collectives (FSDP2's reduce-scatter, tensor parallel's all-reduces, the "
                              "pipeline's sends) run on CUDA tensors, which gloo does not take; use strategy.backend="
                              "auto (nccl), one GPU per worker")
        super().validate()
        workers = self.starter.processes()
        if shape.workers != workers:
            product = " x ".join(f"strategy.{k}={v}" for k, v in o.degrees.items() if v > 1) or "strategy.tp=1"
            gpus = torch.cuda.device_count() if t.cuda else None
            more = (f"strategy.nproc_per_node={shape.workers}" if gpus is None or shape.workers <= gpus else
                    f"a machine with {shape.workers} GPUs (this one has {gpus}; the mesh takes one per worker)")
            raise ConfigError(f"{product} = {shape.workers} worker(s) is not allowed with {workers} worker(s): the "
                              f"degrees' product must be the number of workers; set the degrees so (dp_replicate x "
                              f"dp_shard x tp x pp = {workers}), or {more}")
        self._validate_data_parallel()
        if o.tp == 1:
            for key, value in (("plan", o.plan), ("parallelize", o.parallelize)):
                if value:
                    raise ConfigError(f"strategy.{key} is not allowed with strategy.tp=1: it says how tensor parallel "
                                      "splits the model; set strategy.tp (> 1) or leave it out")
            if o.sequence_parallel:
                raise ConfigError("strategy.sequence_parallel=true is not allowed with strategy.tp=1: it splits "
                                  "the sequence over the tensor-parallel ranks; set strategy.tp (> 1)")
        self._validate_pipeline()

    def _validate_data_parallel(self) -> None:
        o, t = self.options, self.trainer
        if o.compression == "bf16" and self.on_nccl_gpus():
            refuse_bf16_reduce_without_support("none or fp16" if o.runs_ddp else "none")
        if o.runs_ddp:
            if o.compression == "powersgd" and not t.cuda and torch.cuda.is_available():
                # powerSGD_hook.py: `if torch.cuda.is_available(): torch.cuda.synchronize(device)` with the bucket's
                # device, which for CPU workers is the CPU (ValueError: Expected a cuda device)
                raise ConfigError("strategy.compression=powersgd is not allowed with CPU workers on a machine with "
                                  "GPUs: torch's PowerSGD hook synchronizes the bucket's device as a GPU whenever one "
                                  "is visible; train on the GPUs, or hide them (CUDA_VISIBLE_DEVICES=)")
            return
        if o.cpu_offload and not t.cuda:
            raise ConfigError("strategy.cpu_offload=true is not allowed without GPUs: the parameters and optimizer "
                              "state already live in CPU memory; use strategy.cpu_offload=false")
        if t.precision == "fp16":
            raise ConfigError(f"trainer.precision=fp16 is not allowed with strategy={self.name}: fp16 needs a loss "
                              "scaler for DTensor gradients across the mesh, which torch.amp.GradScaler is not; use "
                              "bf16 (no loss scaling needed) or fp32 (or strategy=ddp, which scales fp16 losses)")

    def _validate_pipeline(self) -> None:
        o, t = self.options, self.trainer
        if o.pp == 1:
            for key in ("split_points", "microbatches", "stages_per_rank"):
                if getattr(o, key) is not None:
                    raise ConfigError(f"strategy.{key}={getattr(o, key)} is not allowed with strategy.pp=1: it says "
                                      "how pipeline parallel runs; set strategy.pp (> 1) or leave it out")
            return
        if dist_config.pipeline_per_direction_p2p and not t.cuda:
            raise ConfigError("TORCH_DISTRIBUTED_PIPELINE_PER_DIRECTION_P2P=1 is not allowed with strategy.pp on CPU "
                              "workers: torch splits the pipeline's group into one communicator per direction only "
                              "where the default group is bound to a GPU; unset it (it is for nccl's V and looped "
                              "schedules)")
        v, m = o.virtual_stages, o.pipeline_microbatches
        if o.schedule in MULTI_STAGE and v < 2:
            raise ConfigError(f"strategy.stages_per_rank={v} is not allowed with strategy.schedule={o.schedule}: it "
                              "interleaves several stages per rank; use 2 or more (or strategy.schedule=1F1B)")
        if o.schedule == "ZBVZeroBubble" and v != 2:
            raise ConfigError(f"strategy.stages_per_rank={v} is not allowed with strategy.schedule=ZBVZeroBubble: it "
                              "runs exactly 2 stages per rank, down the ranks and back (a V); use 2")
        if o.schedule not in MULTI_STAGE and v > 1:
            raise ConfigError(f"strategy.stages_per_rank={v} is not allowed with strategy.schedule={o.schedule}: "
                              f"it runs one stage per rank; use 1, or a schedule of several ({', '.join(MULTI_STAGE)})")
        if o.schedule in ZERO_BUBBLE and t.compile:
            raise ConfigError(f"trainer.compile=true is not allowed with strategy.schedule={o.schedule}: a zero-bubble "
                              "schedule splits each backward into its input and its weight gradients, which torch "
                              "does not do for compiled modules; use trainer.compile=false, or strategy.schedule="
                              "Interleaved1F1B")
        micro_batch = t.batch_size // (self.shape.dp_size * t.grad_accum)
        if micro_batch % m:
            raise ConfigError(f"strategy.microbatches={m} is not allowed with a micro-batch of {micro_batch} "
                              f"(trainer.batch_size={t.batch_size} / ({self.shape.dp_size} data-parallel rank(s) x "
                              f"trainer.grad_accum={t.grad_accum})): each pipeline micro-batch must be as large as the "
                              f"others; use a number of microbatches that divides {micro_batch}")
        if o.schedule == "1F1B" and m < o.pp:
            raise ConfigError(f"strategy.microbatches={m} is not allowed with strategy.schedule=1F1B and "
                              f"strategy.pp={o.pp}: 1F1B needs at least as many microbatches as stages")
        rounds = max(1, m // o.pp)
        if o.schedule in ("Interleaved1F1B", "InterleavedZeroBubble") and m % rounds:
            raise ConfigError(f"strategy.microbatches={m} is not allowed with strategy.schedule={o.schedule} and "
                              f"strategy.pp={o.pp}: it runs rounds of microbatches / pp ({rounds}) that must divide "
                              f"the microbatches; use a multiple of {o.pp}")

    def check_model(self, model: nn.Module) -> None:
        o = self.options
        if o.shard_class_names is not None:
            self._check_shard_modules(model)
        if o.tp > 1:
            check_plan(model, o)
        if o.pp > 1:
            stages = stage_pieces(model, o.pp * o.virtual_stages, o.split_points)
            if self.shape.sharded:
                self._check_ties_on_one_rank(model, stages)

    def _check_shard_modules(self, model: nn.Module) -> None:
        names = self.options.shard_class_names
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
        """The modules FSDP2 shards (and all-gathers) as one unit each, innermost first; the root comes last
        (strategy.shard_modules' classes, or each block holding parameters: containers are descended into, tied
        parameters stay in one unit, framework/strategies/mesh/fsdp_units.py)."""
        names = self.options.shard_class_names
        units = auto_units(model) if names is None else named_units(model, names)
        return innermost_first(model, without_tied(model, units))

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

    def check_task(self, model: nn.Module, example, train) -> None:
        self._check_stream(train)
        o = self.options
        if o.pp > 1:
            key = f"strategy.split_points={list(o.split_points)}" if o.split_points else f"strategy.pp={o.pp}"
            check_stages(model, stage_pieces(model, o.pp * o.virtual_stages, o.split_points), example, key)

    def _check_stream(self, train) -> None:
        o = self.options
        if o.pp > 1 and is_stream(train):
            raise ConfigError(f"strategy.pp={o.pp} is not allowed with a streaming dataset.train (an IterableDataset): "
                              "a stream's last micro-batches may be short, and a pipeline cuts each micro-batch into "
                              "equal microbatches; use a map-style dataset, or strategy.pp=1")
        if o.tp > 1 and shards_itself(train):
            raise ConfigError(f"strategy.tp={o.tp} is not allowed with a dataset.train that shards itself over ranks "
                              "(shards_itself, or a HuggingFace IterableDataset): tensor-parallel peers must read the "
                              "same batches, which the framework deals out by data-parallel rank; use a stream the "
                              "framework shards (shards_itself = False), or strategy.tp=1")

    def speedup_modules(self, model: nn.Module) -> SpeedupModules:
        """DDP: the blocks recomputed, the whole model compiled inside DDP. FSDP2 alone: each of its units recomputed
        (fully_shard's hooks stay outside the recomputed forward) and compiled on its own before fully_shard
        (torchtitan's way: the all-gathers between units stay in its eager hooks). Tensor and pipeline parallel: the
        blocks holding parameters, one by one (on a pipeline rank, those of its own stages; a Sequential's activations
        and poolings are left to the layers around them)."""
        o = self.options
        if o.runs_ddp:
            return super().speedup_modules(model)
        if o.tp == o.pp == 1:
            units = self.shard_units(model)
            return SpeedupModules(recomputed=units, compiled=units)
        units = [m for m in (model.get_submodule(name) for name in blocks(model)) if holds_parameters(m)]
        units = units or auto_units(model)
        return SpeedupModules(recomputed=units, compiled=units)

    # ---- the workers ----------------------------------------------------------------------------------------
    def join(self) -> ProcessGroup:
        o = self.options
        if o.runs_ddp:  # DDP takes the default group: the 1-D replicate mesh needs no DeviceMesh
            return TorchGroup.join(self.starter.ranks, self.backend, self.trainer.cuda, o.timeout)
        return MeshGroup.join_mesh(self.starter.ranks, self.backend, self.trainer.cuda, o.timeout, self.shape)

    def parallelize(self, model: nn.Module, make_optimizer, group: MeshGroup) -> Wrapped:
        o, shape = self.options, self.shape
        if o.runs_ddp:
            return wrap_with_ddp(model, make_optimizer, group, o, self._precision(group.device))
        coords = group.coords
        whole = WholeModel(model)
        stages = stage_pieces(model, o.pp * o.virtual_stages, o.split_points) if o.pp > 1 else [pieces(model)]
        holders = stage_ranks(len(stages), o.pp, o.schedule)
        mine = [s for s in range(len(stages)) if holders[s] == coords["pp"]]
        ties = find_ties(model, {p: holders[s] for s, names in enumerate(stages) for p in names}) if o.pp > 1 else []
        if o.pp > 1:
            cut(model, {p for s in mine for p in stages[s]})
        parts = {s: model if len(mine) == 1 else view(model, set(stages[s])) for s in mine}
        for s, part in parts.items():
            if s > 0 and changes_its_input(model, stages[s]):
                copy_input_first(part)
        self._split(list(parts.values()), group)
        model.to(group.device)  # what tensor parallel and FSDP2 left: plain parameters, buffers
        named = list(model.named_parameters())
        params = [p for _, p in named]
        pp_group = group.axis("pp").get_group() if o.pp > 1 else None
        tied = TiedGradients(ties, model, shape, group.rank, pp_group)
        precision = self._precision(group.device, params, tied, pp_group)
        gathers = coords["dp_replicate"] == coords["dp_shard"] == coords["tp"] == 0
        io = MeshCheckpoints(group, model, whole, tied.canonical, gathers=gathers, cpu_offload=o.cpu_offload)
        # the stage's parameters, tensor parallel's DTensors among them, by the whole model's names (a tied copy by
        # the name the whole model has it under): what optimizer.param_groups' patterns match
        optimizer = make_optimizer(params, names=[tied.canonical.get(name, name) for name, _ in named])
        per_tensor_where_mixed(optimizer)
        # strategy.compression=bf16: cast for the wire only (framework/strategies/mesh/fsdp_wire.py)
        wire = WireDtype(torch.bfloat16) if o.compression == "bf16" else None
        traffic = counted_reduce_scatters(model, o.compression, wire) if shape.sharded else None
        if o.pp == 1:
            return MeshWrapped(model, optimizer, precision, io, model, fsdp=shape.sharded, traffic=traffic,
                               reshard_after_forward=o.reshard_after_forward)
        runner = PipelineRunner(parts, holders, o, coords["pp"], pp_group, group.device, precision=precision)
        runner.measure_links()
        pipeline = Pipeline(runner)
        return PipelineWrapped(pipeline, optimizer, precision, io, model, runner=runner, traffic=traffic)

    def _precision(self, device, params=(), tied=None, pp_group=None) -> Precision:
        """The run's one Precision: DDP's autocast and fp16 loss scaling; on any other mesh, clipping over it
        (DTensor gradients, pipeline stages) and autocast where FSDP2 does not cast."""
        if self.options.runs_ddp:
            return Precision(self.trainer.precision, device)
        return MeshPrecision(self.trainer.precision, device, list(params), self.shape.sharded, tied, pp_group)

    def _split(self, parts: list[nn.Module], group: MeshGroup) -> None:
        """Tensor parallel by the plan, then FSDP2 over the data-parallel axes (each block a unit, tied parameters
        left to the root), on each of this rank's stages, while they are still in CPU memory: tensor parallel moves
        each parameter to the mesh's device as it splits it, fully_shard each unit as it shards it, so no GPU ever
        holds a whole stage in fp32 (a model.to(device) first would)."""
        o, precision = self.options, ShardPrecision.of(self.trainer.precision)
        if o.tp > 1:
            for part in parts:
                apply_tensor_parallel(part, o, group.axis("tp"))
        if self.shape.sharded:
            offload = CPUOffloadPolicy() if o.cpu_offload else OffloadPolicy()
            for part in parts:
                # pipeline stages keep parameters gathered between their micro-batches' forward and backward (as
                # torchtitan does: resharding would gather them again for every micro-batch)
                shard_with_fsdp2(part, self.shard_units(part), group.dp_mesh(), precision,
                                 reshard_after_forward=o.reshard_after_forward and o.pp == 1, offload=offload)


class MeshWrapped(Wrapped):
    """Tensor parallel and FSDP2 (no pipeline). GradientSync where FSDP2 runs: an accumulation's non-final
    micro-batches keep their gradients unreduced and unsharded; with reshard_after_forward=false (memory traded for
    speed) the parameters also stay unsharded until the last micro-batch, so its forward gathers nothing again."""

    def __init__(self, *args, fsdp: bool, reshard_after_forward: bool, traffic=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fsdp, self.reshard_after_forward = fsdp, reshard_after_forward
        self.traffic = traffic  # CountsTraffic: FSDP2's reduce-scatters, where they carry every gradient
        self.comm_clock = None  # OwnClock: every micro-batch's collectives (mesh/comm_clock.py)

    def gradient_sync(self, on: bool):
        if self.fsdp:
            self.model.set_requires_gradient_sync(on)
            if not self.reshard_after_forward:
                self.model.set_reshard_after_backward(on)
        return self.comm_clock.timing() if self.comm_clock else contextlib.nullcontext()

    def wait_clock(self, group: ProcessGroup) -> CommClock:
        self.comm_clock = CommClock(group.device)
        return self.comm_clock


class Pipeline(nn.Module):
    """This rank's stages as one module: what the loop trains (train()/eval() reach every stage) and evaluates (its
    forward: the forward-only pass, the outputs on every rank). Training steps go through the schedule."""

    def __init__(self, runner: PipelineRunner):
        super().__init__()
        self.stages = nn.ModuleList(module for _, module in sorted(runner.stage_modules.items()))
        self.runner = runner

    def forward(self, inputs):
        return self.runner.forward(inputs)


class PipelineWrapped(Wrapped):
    """OwnsForwardBackward (the schedule runs the micro-batch's forwards and backwards) and OwnClock (each stage's
    compute, bubble and communication)."""

    def __init__(self, *args, runner: PipelineRunner, traffic=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.runner = runner
        self.traffic = traffic  # CountsTraffic: FSDP2's reduce-scatters, where they carry every gradient

    def forward_backward(self, step, batch, loss, weighting):
        return self.runner.forward_backward(step, batch, loss, weighting)

    def wait_clock(self, group: ProcessGroup | None = None):
        return self.runner.clock
