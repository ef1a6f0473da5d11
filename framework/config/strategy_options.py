"""Each built-in strategy's options (conf/strategy/*.yaml), one dataclass per strategy class (its `Options`).

conf/strategy/*.yaml compose from these, closed (framework/config/schemas.py): a key a built-in strategy lacks fails
while Hydra composes. The driver types a strategy node with the Options of the class its `_target_` names, closed: a
key the class does not declare is refused with the keys it has. A user's strategy declares its own options by
subclassing these (examples/my_project/mypkg/strategies.py), and its YAML starts from the open copy of the schema it
extends (examples/my_project/conf/strategy/announcing_ddp.yaml)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from framework.config.choices import Backend, Compression, RdzvBackend, ReduceOp
from framework.config.rules import (Checked, Rule, SettingError, above, at_least, int_list, non_empty_text, one_of,
                                    rule)

REST_OF_THE_WORLD = -1  # a data-parallel degree of the mesh: the workers divided by the other degrees


@dataclass
class StrategyOptions(Checked):
    _target_: str = ""  # the Strategy subclass
    name: str = rule("", non_empty_text())  # the strategy's name in run folders, results and messages


def allow_compression(options, allowed: tuple[str, ...], why: str) -> None:
    """strategy.compression (what gradients travel as): the values this engine runs; another is refused in one line
    saying why and naming those it allows."""
    if options.compression not in allowed:
        raise SettingError("compression", options.compression, message=(
            f"{{key}}.compression={options.compression} is not allowed with strategy={options.name}: {why}; "
            f"allowed: {', '.join(allowed)}"))


@dataclass
class SingleOptions(StrategyOptions):
    _target_: str = "framework.strategies.single.SingleStrategy"
    name: str = "single"
    compression: Compression = Compression.none  # one process sends no gradients: none only

    def check(self) -> None:
        allow_compression(self, ("none",), "one process sends no gradients (strategy=ddp compresses them: none, "
                                           "fp16, bf16, powersgd)")


@dataclass
class DPOptions(StrategyOptions):
    _target_: str = "framework.strategies.dp.DataParallelStrategy"
    name: str = "dp"
    device_ids: Optional[List[int]] = rule(None, int_list(0, unique=True))  # GPU ids; null: every visible GPU
    compression: Compression = Compression.none  # nn.DataParallel has no all-reduce: none only

    def check(self) -> None:
        allow_compression(self, ("none",), "nn.DataParallel sums its replicas' gradients on the first GPU inside "
                                           "backward, with no all-reduce to compress (strategy=ddp compresses them: "
                                           "none, fp16, bf16, powersgd)")


@dataclass(kw_only=True)
class ElasticOptions(StrategyOptions):
    """How workers start and join, for every strategy that starts them like ddp (torch's elastic agent)."""

    nproc_per_node: Optional[int] = rule(None, at_least(1))  # null: one per GPU, or 2 CPU workers (gloo) without
    backend: Backend = Backend.auto  # auto | nccl | gloo (auto: nccl with GPUs, gloo without)
    nnodes: int = rule(1, at_least(1))  # multi-node: start the same command on every node
    rdzv_endpoint: Optional[str] = None  # HOST:PORT of the rendezvous (needed when nnodes > 1)
    rdzv_backend: RdzvBackend = RdzvBackend.c10d  # c10d | static (static: set node_rank)
    node_rank: Optional[int] = rule(None, at_least(0))  # this node's rank, for rdzv_backend=static
    max_restarts: int = rule(0, at_least(0))  # restarts of the worker group by the elastic agent after a failure
    run_id: Optional[str] = None  # rendezvous id shared by all nodes of one job (null: a fresh one per run)
    # seconds a collective may wait before the process group gives up (longer than trainer.stall_timeout, whose
    # watchdog names the stalled rank first)
    timeout: float = rule(600.0, above(0))

    def check(self) -> None:
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise SettingError("nnodes", self.nnodes, message=f"{{key}}.nnodes={self.nnodes} needs "
                               "{key}.rdzv_endpoint=HOST:PORT (the same on every node; rank 0's node hosts the rendezvous)")
        if self.rdzv_backend == "static" and self.node_rank is None and self.nnodes > 1:
            raise SettingError("node_rank", None, message="{key}.rdzv_backend=static needs {key}.node_rank "
                               "(0..nnodes-1) on every node")


@dataclass
class PowerSGDOptions:
    """strategy.powersgd: torch's PowerSGD (ddp with strategy.compression=powersgd); checked by MeshOptions.check on the ddp mesh."""

    rank: int = 2  # matrix approximation rank: a gradient matrix n x m travels as (n + m) x rank numbers
    start_step: int = 100  # the first step whose gradients travel compressed; plain all-reduce before it (warm-up)
    error_feedback: bool = True  # what compression left out of a step's gradients is added to the next step's
    warm_start: bool = True  # each step's low-rank factors start from the previous step's


# torch.distributed.pipelining's schedules, by their names there (ScheduleGPipe, ...)
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
MULTI_STAGE = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")  # several stages per rank
ZERO_BUBBLE = ("InterleavedZeroBubble", "ZBVZeroBubble")  # backward split into input and weight gradients


MESH_TARGET = "framework.strategies.mesh.engine.MeshStrategy"
DDP_KEYS = ("sync_batchnorm", "find_unused_parameters", "bucket_cap_mb", "gradient_as_bucket_view", "static_graph",
            "powersgd")  # DDP's own, on the 1-D replicate mesh only
FSDP_KEYS = ("shard_modules", "reshard_after_forward", "cpu_offload")  # FSDP2's, wherever it runs


@dataclass(kw_only=True)
class MeshOptions(ElasticOptions):
    """One device mesh, dp_replicate x dp_shard x tp x pp (framework/strategies/mesh/): the presets ddp, fsdp,
    hsdp, tp and pp differ only in their defaults. dp_replicate alone (the 1-D replicate mesh) trains with DDP itself;
    any other mesh with FSDP2 over its data-parallel axes. The degrees' product is the number of workers (with
    nproc_per_node=null on the CPU, that many gloo workers start)."""

    _target_: str = MESH_TARGET
    name: str = "mesh"
    # data-parallel replicas, each holding the whole (sharded) model; -1: the rest of the world
    dp_replicate: int = rule(1, Rule("an integer >= 1, or -1 (the rest of the world)",
                                     lambda v: v >= 1 or v == REST_OF_THE_WORLD))
    # data-parallel ranks FSDP2 shards parameters and optimizer state over; -1: the rest of the world
    dp_shard: int = rule(1, Rule("an integer >= 1, or -1 (the rest of the world)",
                                 lambda v: v >= 1 or v == REST_OF_THE_WORLD))
    tp: int = rule(1, at_least(1))  # tensor parallel: each layer of the plan split over this many ranks
    pp: int = rule(1, at_least(1))  # pipeline parallel: the model cut into stages on this many ranks
    # tensor parallel: module-name pattern -> style (colwise, rowwise, sequence, ...), written in a strategy YAML of
    # yours (examples/my_project/conf/strategy/tp_plan.yaml); empty: the model's own tensor_parallel_plan (the
    # built-in GPT has one)
    plan: Dict[str, str] = field(default_factory=dict)
    # instead of a plan: {_target_: a function (model, mesh, **the other keys) that parallelizes the model over the
    # tp mesh in place}; empty: none
    parallelize: Dict[str, Any] = field(default_factory=dict)
    sequence_parallel: bool = False  # the built-in plan's sequence-parallel variant (norms and residuals sharded)
    # pipeline parallel
    schedule: str = rule("1F1B", one_of(*SCHEDULES, allowed=", ".join(SCHEDULES)))
    microbatches: Optional[int] = rule(None, at_least(1))  # per optimizer micro-batch; null: 2 x pp
    # virtual stages; null: 2 for the schedules that run several per rank (Interleaved*, ZBV), else 1
    stages_per_rank: Optional[int] = rule(None, at_least(1))
    split_points: Optional[List[str]] = None  # module names where a stage begins; null: the blocks cut evenly
    # FSDP2 over the data-parallel axes. shard_modules: auto (each child holding parameters, containers descended
    # into, tied modules left to the root) | a list of module class names
    shard_modules: Any = "auto"
    reshard_after_forward: bool = True  # free gathered parameters after forward (less memory)
    cpu_offload: bool = False  # sharded parameters, gradients and the optimizer step in CPU memory (GPUs only)
    # time tp's and FSDP2's collectives of each micro-batch as time/wait_ms (framework/strategies/mesh/comm_clock.py):
    # null: on CPU workers (gloo's collectives block anyway), off on GPUs, where waiting for each collective where it
    # starts would take away its overlap with compute; true/false: always/never (its cost: a Python call per operator)
    comm_clock: Optional[bool] = None
    # DDP (the 1-D replicate mesh)
    sync_batchnorm: bool = False
    find_unused_parameters: bool = False
    bucket_cap_mb: float = rule(25.0, above(0))
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    # what gradients travel as: none | bf16 (DDP: cast for the all-reduce; FSDP2: reduce-scattered in bf16) | fp16 and
    # powersgd (DDP's communication hooks; powersgd: low rank with error feedback, strategy.powersgd.*)
    compression: Compression = Compression.none
    powersgd: PowerSGDOptions = field(default_factory=PowerSGDOptions)

    def check(self) -> None:
        super().check()
        if self.dp_replicate == self.dp_shard == REST_OF_THE_WORLD:
            raise SettingError("dp_shard", self.dp_shard, message="{key}.dp_replicate=-1 and {key}.dp_shard=-1 are "
                               "not allowed together: -1 is the rest of the world, which one degree can take; set "
                               "the other")
        if self.plan and self.parallelize:
            raise SettingError("plan", self.plan, message="{key}.plan and {key}.parallelize are not allowed together: "
                               "give a plan (module-name pattern -> style) or a parallelize function, not both")
        if self.parallelize and "_target_" not in self.parallelize:
            raise SettingError("parallelize", self.parallelize, "{_target_: a function (model, mesh)}, or none ({})")
        self._check_compression()
        self._check_powersgd()
        self._check_engine_keys()
        names = self.shard_modules
        if names != "auto" and not (isinstance(names, list) and names and all(isinstance(n, str) and n for n in names)):
            raise SettingError("shard_modules", names, "auto (each direct child block that holds parameters) or a "
                               "non-empty list of module class names, e.g. [Sequential]")

    def _check_engine_keys(self) -> None:
        """DDP's keys off the 1-D replicate mesh, FSDP2's where it does not run: refused, never ignored."""
        if self.runs_ddp:
            foreign, where = FSDP_KEYS, "where FSDP2 runs (strategy.dp_shard > 1: strategy=fsdp, hsdp)"
        elif self.runs_fsdp:
            foreign, where = DDP_KEYS, "on the 1-D replicate mesh, where DDP itself trains (dp_replicate alone: " \
                                       "strategy=ddp)"
        else:
            foreign, where = DDP_KEYS + FSDP_KEYS, "with a data-parallel degree: DDP's on the 1-D replicate mesh " \
                                                   "(strategy=ddp), FSDP2's where dp_shard > 1 (strategy=fsdp, hsdp)"
        for key in foreign:
            value = getattr(self, key)
            if value != _default(key):
                raise SettingError(key, value, message=f"{{key}}.{key}={_shown(value)} is not allowed with "
                                   f"{self._describe_degrees()}: it acts {where}")

    def _check_compression(self) -> None:
        if self.runs_ddp:
            return  # DDP's hooks: none, fp16, bf16, powersgd
        if self.runs_fsdp:
            allow_compression(self, ("none", "bf16"), "FSDP2 reduce-scatters gradients in its reduce dtype, and bf16 "
                                                      "is the one that needs no loss scaler (PowerSGD is a DDP hook)")
        else:
            allow_compression(self, ("none",), "the mesh's gradient reductions (FSDP2 over the data-parallel axes, "
                                               "tensor-parallel partial sums) have no compression proven equal here; "
                                               "strategy=fsdp reduces in bf16, strategy=ddp compresses")

    def _check_powersgd(self) -> None:
        p = self.powersgd
        if self.compression != "powersgd":
            changed = [f"{k}={v}" for k, v in vars(p).items() if v != getattr(PowerSGDOptions(), k)]
            if changed:
                raise SettingError("powersgd", p, message=f"{{key}}.powersgd.{changed[0]} is not allowed with "
                                   f"{{key}}.compression={self.compression}: it sets PowerSGD, which runs with "
                                   "{key}.compression=powersgd")
            return
        if not isinstance(p.rank, int) or p.rank < 1:
            raise SettingError("powersgd", p.rank, message=f"{{key}}.powersgd.rank={p.rank!r} is not allowed: "
                               "expected an integer >= 1 (the rank of each gradient's low-rank approximation)")
        # torch's PowerSGDState: DDP rebuilds its gradient buckets after the first step, and error feedback and warm
        # start keep their state per bucket, so compression starts after the second step at the earliest
        first = 3 if p.error_feedback or p.warm_start else 1
        if not isinstance(p.start_step, int) or p.start_step < first:
            raise SettingError("powersgd", p.start_step, message=(
                f"{{key}}.powersgd.start_step={p.start_step!r} is not allowed: expected an integer >= {first}" +
                (" with error feedback or warm start (DDP rebuilds its gradient buckets after step 1, and PowerSGD "
                 "keeps their state from step 3 on)" if first == 3 else "")))

    def _describe_degrees(self) -> str:
        shown = [f"{{key}}.{k}={v}" for k, v in self.degrees.items() if v != 1]
        return " x ".join(shown) or "{key}.dp_replicate=1 (one worker)"

    @property
    def runs_ddp(self) -> bool:
        """The 1-D replicate mesh (dp_replicate alone): DDP itself, with its buckets, hooks and no_sync."""
        return self.dp_shard == self.tp == self.pp == 1

    @property
    def runs_fsdp(self) -> bool:
        """FSDP2 over the data-parallel axes: any data-parallel degree beside another axis, or dp_shard."""
        return not self.runs_ddp and (self.dp_shard != 1 or self.dp_replicate != 1)

    @property
    def shard_class_names(self) -> list[str] | None:
        """None for auto, else the class names listed."""
        return None if self.shard_modules == "auto" else list(self.shard_modules)

    @property
    def degrees(self) -> dict[str, int]:
        return {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "tp": self.tp, "pp": self.pp}

    @property
    def virtual_stages(self) -> int:
        if self.stages_per_rank is not None:
            return self.stages_per_rank
        return 2 if self.schedule in MULTI_STAGE else 1

    @property
    def pipeline_microbatches(self) -> int:
        return self.microbatches if self.microbatches is not None else 2 * self.pp


def _default(key: str):
    f = MeshOptions.__dataclass_fields__[key]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _shown(value) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in vars(value).items()) + "}" if hasattr(value, "__dataclass_fields__") \
        else str(value).lower() if isinstance(value, bool) else str(value)


# the presets of the one mesh engine (conf/strategy/<name>.yaml): name -> the degrees it sets
PRESETS = {"ddp": {"dp_replicate": REST_OF_THE_WORLD}, "fsdp": {"dp_shard": REST_OF_THE_WORLD},
           "hsdp": {"dp_replicate": 2, "dp_shard": 2}, "tp": {"tp": 2}, "pp": {"pp": 2}}


def preset(name: str, **changes) -> MeshOptions:
    """The options conf/strategy/<name>.yaml composes to (its degrees), with `changes`."""
    return MeshOptions(name=name, **{**PRESETS[name], **changes})


@dataclass(kw_only=True)
class DeepSpeedOptions(ElasticOptions):
    _target_: str = "framework.strategies.deepspeed.DeepSpeedStrategy"
    name: str = "deepspeed"
    # 0 none, 1 optimizer state, 2 + gradients, 3 + parameters partitioned across ranks
    zero_stage: int = rule(2, one_of(0, 1, 2, 3, allowed="0, 1, 2 or 3 (ZeRO stage: 0 none, 1 optimizer state, "
                                                        "2 + gradients, 3 + parameters partitioned across ranks)"))
    offload_optimizer: bool = False  # optimizer state and step on the CPU (ZeRO stages 1-3)
    config: Dict[str, Any] = field(default_factory=dict)  # merged into the generated DeepSpeed config
    compression: Compression = Compression.none  # none only (DeepSpeed compresses with its 1-bit optimizers)

    def check(self) -> None:
        super().check()
        allow_compression(self, ("none",), "DeepSpeed compresses gradients with its own optimizers (1-bit Adam, "
                                           "0/1 Adam, 1-bit LAMB), which need NCCL or MPI and would replace the "
                                           "optimizer group's optimizer; strategy=ddp compresses them")
        if self.offload_optimizer and self.zero_stage == 0:
            raise SettingError("offload_optimizer", True, message="{key}.offload_optimizer=true is not allowed with "
                               "{key}.zero_stage=0: DeepSpeed offloads the partitioned optimizer state of ZeRO; use "
                               "{key}.zero_stage=1, 2 or 3")


@dataclass(kw_only=True)
class HorovodOptions(StrategyOptions):
    _target_: str = "framework.strategies.horovod.HorovodStrategy"
    name: str = "horovod"
    np: Optional[int] = rule(None, at_least(1))  # workers in the whole job; null: one per GPU, or 2 CPU workers
    hosts: Optional[str] = None  # multi-node: HOST:SLOTS,... (needs np and ssh to every host)
    compression: Compression = Compression.none  # none | fp16 (fp16: gradients travel as fp16)
    op: ReduceOp = ReduceOp.average  # average | sum | adasum (adasum needs a horovod built with MPI)
    # gradient accumulation has one setting, trainer.grad_accum; the YAML sets this to it, another value is refused
    backward_passes_per_step: int = rule(1, at_least(1))

    def check(self) -> None:
        allow_compression(self, ("none", "fp16"), "Horovod's compressors are none and fp16")
        if self.hosts is not None:
            self.host_slots()
            if self.np is None:
                raise SettingError("hosts", self.hosts, message=f"{{key}}.hosts={self.hosts!r} needs {{key}}.np (the "
                                   "total number of workers)")

    def host_slots(self) -> dict[str, int]:
        slots: dict[str, int] = {}
        for item in str(self.hosts).split(","):
            name, _, count = item.strip().partition(":")
            if not name or not count.isdigit() or int(count) < 1:
                raise SettingError("hosts", self.hosts, "HOST:SLOTS[,HOST:SLOTS...], e.g. node1:2,node2:2")
            slots[name] = int(count)
        return slots
