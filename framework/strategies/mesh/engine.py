"""The mesh engine (strategy=ddp, fsdp, hsdp, tp, pp: presets of its degrees dp_replicate x dp_shard x tp x pp):
workers start and join like torchrun's on one DeviceMesh; parallelize() is the data parallel's the degrees chose once
(data_parallel_for: DDP itself on the 1-D replicate mesh, mesh/ddp.py; on every other, FSDP2 and DTensors after the
pipeline cut and tensor parallel, in torchtitan's order: mesh/sharded.py, mesh/parallelize.py). Checked here, in the
driver: the degrees against the workers, the pipeline's schedule and stages (the model's plan and units: Sharded's)."""
from __future__ import annotations

import dataclasses
import re

import torch
import torch.distributed.config as dist_config
from torch import nn

from framework.common.errors import ConfigError
from framework.config.strategy_options import MULTI_STAGE, REST_OF_THE_WORLD, ZERO_BUBBLE, MeshOptions
from framework.config.trainer import EngineSettings
from framework.data.streams import is_stream, shards_itself
from framework.session.environment import Ranks
from framework.strategies.mesh.dims import MeshDims
from framework.strategies.mesh.ddp import DDP
from framework.strategies.mesh.pipeline_cut import check_stages, stage_pieces
from framework.strategies.torch_distributed import ElasticStrategy
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.speedups import SpeedupModules


# pyproject allows torch >= 2.4 for ddp and fsdp; tensor and pipeline parallel's APIs are newer, and this is the torch
# their tests ran
TESTED_TORCH = (2, 14)


def release(version: str) -> tuple[int, ...]:
    """A torch version's release numbers: NVIDIA's containers and nightlies build `2.14.0a0+sha`, which PEP 440
    sorts before 2.14 although it holds 2.14's APIs."""
    leading = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in leading.group().split(".")[:len(TESTED_TORCH)]) if leading else ()


def data_parallel_for(options: MeshOptions, trainer: EngineSettings):
    """DDP on the 1-D replicate mesh (dp_replicate alone), keeping its buckets, hooks, no_sync and fp16 scaling;
    FSDP2 and DTensors on any other (torchtitan refuses DDP beside another axis too)."""
    if options.runs_ddp:
        return DDP(options, trainer)
    # The sharded side (DTensor, FSDP2, DCP checkpoints, tensor parallel: 0.3-0.5 s of imports in each worker beyond
    # torch._dynamo's) is imported only where the degrees need it, never by ddp (tests/runs/test_startup_imports.py).
    from framework.strategies.mesh.sharded import Sharded
    return Sharded(options, trainer)


class MeshStrategy(ElasticStrategy):
    Options = MeshOptions
    options: MeshOptions

    def __init__(self, options: MeshOptions, trainer, ranks: Ranks | None):
        # a degree of -1: the starter's workers decide (one per GPU, or 2 on the CPU), not the degrees
        unfilled = REST_OF_THE_WORLD in MeshDims(**options.degrees).sizes
        if options.nproc_per_node is None and not trainer.cuda and ranks is None and not unfilled:
            # on the CPU the mesh says how many gloo workers to start (on GPUs: one per GPU, checked in validate)
            workers = MeshDims(**options.degrees).workers
            options = dataclasses.replace(options, nproc_per_node=max(1, workers // options.nnodes))
        self.data_parallel = dp = data_parallel_for(options, trainer)
        self.channels_last_refusal, self.moves_model_itself = dp.channels_last_refusal, dp.moves_model_itself
        self._describe_note, self.gloo_shares_gpus = dp.describe_note, dp.gloo_shares_gpus
        super().__init__(options, trainer, ranks, dp.checkpoint_format)

    def backend_for(self, options: MeshOptions, cuda: bool) -> str:
        """With cpu_offload the sharded gradients live in CPU memory, and clipping and the non-finite check
        all-reduce them there: the group needs gloo for CPU tensors beside nccl for CUDA ones (pytorch#148532)."""
        backend = super().backend_for(options, cuda)
        if options.cpu_offload and cuda and backend == "nccl":
            return "cpu:gloo,cuda:nccl"
        return backend

    @property
    def dims(self) -> MeshDims:
        """The degrees, a -1 among them made the rest of the world (the workers the starter starts or was given)."""
        return MeshDims(**self.options.degrees).filled(self.starter.processes())

    def batch_shares(self) -> int:
        return self.dims.dp_size

    @property
    def muon_steps(self) -> str:
        return self.data_parallel.muon_steps(self.dims)

    # ---- the driver -----------------------------------------------------------------------------------------
    def validate(self) -> None:
        o, t, dims = self.options, self.trainer, self.dims
        if (o.tp > 1 or o.pp > 1) and release(torch.__version__) < TESTED_TORCH:
            tested = ".".join(map(str, TESTED_TORCH))
            raise ConfigError(f"strategy={self.name} is not allowed with torch {torch.__version__}: the mesh engine "
                              f"needs torch >= {tested}, what it is tested with (torch.distributed.pipelining's "
                              "pre-split micro-batches and zero-bubble schedules, DTensor's norms); pip install "
                              f"'torch>={tested}' (ddp, fsdp and the other strategies take torch >= 2.4)")
        if t.cuda and "nccl" not in self.backend and not self.gloo_shares_gpus:
            raise ConfigError(f"strategy.backend={o.backend} is not allowed with strategy={self.name} on GPUs: the "
                              "mesh's collectives (FSDP2's reduce-scatter, tensor parallel's all-reduces, the "
                              "pipeline's sends) run on CUDA tensors, which gloo does not take; use strategy.backend="
                              "auto (nccl), one GPU per worker")
        super().validate()
        workers = self.starter.processes()
        if dims.workers != workers:
            product = " x ".join(f"strategy.{k}={v}" for k, v in o.degrees.items() if v > 1) or "strategy.tp=1"
            gpus = torch.cuda.device_count() if t.cuda else None
            more = (f"strategy.nproc_per_node={dims.workers}" if gpus is None or dims.workers <= gpus else
                    f"a machine with {dims.workers} GPUs (this one has {gpus}; the mesh takes one per worker)")
            raise ConfigError(f"{product} = {dims.workers} worker(s) is not allowed with {workers} worker(s): the "
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
        if self.options.compression == "bf16" and self.on_nccl_gpus() and not _nccl_reduces_bf16():
            raise ConfigError("strategy.compression=bf16 is not allowed on these GPUs: gradients reduced in bf16 need "
                              "GPUs with bf16 (torch.cuda.is_bf16_supported) and NCCL >= 2.10; use strategy."
                              f"compression={self.data_parallel.other_compressions}")
        self.data_parallel.validate()

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
        micro_batch = t.batch_size // (self.dims.dp_size * t.grad_accum)
        if micro_batch % m:
            raise ConfigError(f"strategy.microbatches={m} is not allowed with a micro-batch of {micro_batch} "
                              f"(trainer.batch_size={t.batch_size} / ({self.dims.dp_size} data-parallel rank(s) x "
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
        self.data_parallel.check_model(model, self.dims)

    def check_task(self, model: nn.Module, example, train) -> None:
        self._check_stream(train)
        o = self.options
        if o.pp > 1:
            key = f"strategy.split_points={list(o.split_points)}" if o.split_points else f"strategy.pp={o.pp}"
            check_stages(model, stage_pieces(model, o.pp * o.virtual_stages, o.split_points), example, key)
        self.data_parallel.check_task(model, example)

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
        return self.data_parallel.speedup_modules(model)

    # ---- the workers ----------------------------------------------------------------------------------------
    def join(self) -> ProcessGroup:
        return self.data_parallel.join(self.starter.ranks, self.backend, self.options.timeout, self.dims)

    def parallelize(self, model: nn.Module, make_optimizer, group: ProcessGroup) -> Wrapped:
        return self.data_parallel.wrap(model, make_optimizer, group)


def _nccl_reduces_bf16() -> bool:
    return torch.cuda.is_bf16_supported(including_emulation=False) and torch.cuda.nccl.version() >= (2, 10)
