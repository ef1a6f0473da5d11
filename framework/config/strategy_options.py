"""Each built-in strategy's options (conf/strategy/*.yaml), one dataclass per strategy class (its `Options`).

conf/strategy/*.yaml compose from these, closed (framework/config/schemas.py): a key a built-in strategy lacks fails
while Hydra composes. The driver types a strategy node with the Options of the class its `_target_` names, closed: a
key the class does not declare is refused with the keys it has. A user's strategy declares its own options by
subclassing these (examples/my_project/mypkg/strategies.py), and its YAML starts from the open copy of the schema it
extends (examples/my_project/conf/strategy/announcing_ddp.yaml)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from framework.config.choices import Backend, Compression, RdzvBackend, ReduceOp
from framework.config.rules import Checked, SettingError, above, at_least, int_list, non_empty_text, one_of, rule


@dataclass
class StrategyOptions(Checked):
    _target_: str = ""  # the Strategy subclass
    name: str = rule("", non_empty_text())  # the strategy's name in run folders, results and messages


@dataclass
class SingleOptions(StrategyOptions):
    _target_: str = "framework.strategies.single.SingleStrategy"
    name: str = "single"


@dataclass
class DPOptions(StrategyOptions):
    _target_: str = "framework.strategies.dp.DataParallelStrategy"
    name: str = "dp"
    device_ids: Optional[List[int]] = rule(None, int_list(0, unique=True))  # GPU ids; null: every visible GPU


@dataclass
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
class DDPOptions(ElasticOptions):
    _target_: str = "framework.strategies.ddp.DDPStrategy"
    name: str = "ddp"
    sync_batchnorm: bool = False
    find_unused_parameters: bool = False
    bucket_cap_mb: float = rule(25.0, above(0))
    gradient_as_bucket_view: bool = True
    static_graph: bool = False


@dataclass
class FSDPOptions(ElasticOptions):
    _target_: str = "framework.strategies.fsdp.FSDPStrategy"
    name: str = "fsdp"
    # auto: each child holding parameters (containers descended into, tied modules left to the root), then the root
    # | a list of module class names
    shard_modules: Any = "auto"
    reshard_after_forward: bool = True  # true: free gathered parameters after forward (less memory)
    cpu_offload: bool = False  # sharded parameters, gradients and the optimizer step in CPU memory (GPUs only)

    def check(self) -> None:
        super().check()
        names = self.shard_modules
        if names != "auto" and not (isinstance(names, list) and names and all(isinstance(n, str) and n for n in names)):
            raise SettingError("shard_modules", names, "auto (each direct child block that holds parameters) or a "
                               "non-empty list of module class names, e.g. [Sequential]")

    @property
    def shard_class_names(self) -> list[str] | None:
        """None for auto, else the class names listed."""
        return None if self.shard_modules == "auto" else list(self.shard_modules)


# torch.distributed.pipelining's schedules, by their names there (ScheduleGPipe, ...)
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
MULTI_STAGE = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")  # several stages per rank
ZERO_BUBBLE = ("InterleavedZeroBubble", "ZBVZeroBubble")  # backward split into input and weight gradients


@dataclass
class MeshOptions(ElasticOptions):
    """One device mesh, dp_replicate x dp_shard x tp x pp (framework/strategies/model_parallel/): the presets tp and pp
    differ only in their defaults. The degrees' product is the number of workers (with nproc_per_node=null on the CPU,
    that many gloo workers start)."""

    _target_: str = "framework.strategies.model_parallel.strategy.MeshStrategy"
    name: str = "mesh"
    dp_replicate: int = rule(1, at_least(1))  # data-parallel replicas, each holding the whole (sharded) model
    dp_shard: int = rule(1, at_least(1))  # data-parallel ranks FSDP2 shards parameters and optimizer state over
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
    reshard_after_forward: bool = True  # FSDP2 over the dp axes: free gathered parameters after forward

    def check(self) -> None:
        super().check()
        if self.plan and self.parallelize:
            raise SettingError("plan", self.plan, message="{key}.plan and {key}.parallelize are not allowed together: "
                               "give a plan (module-name pattern -> style) or a parallelize function, not both")
        if self.parallelize and "_target_" not in self.parallelize:
            raise SettingError("parallelize", self.parallelize, "{_target_: a function (model, mesh)}, or none ({})")

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


@dataclass
class DeepSpeedOptions(ElasticOptions):
    _target_: str = "framework.strategies.deepspeed.DeepSpeedStrategy"
    name: str = "deepspeed"
    # 0 none, 1 optimizer state, 2 + gradients, 3 + parameters partitioned across ranks
    zero_stage: int = rule(2, one_of(0, 1, 2, 3, allowed="0, 1, 2 or 3 (ZeRO stage: 0 none, 1 optimizer state, "
                                                        "2 + gradients, 3 + parameters partitioned across ranks)"))
    offload_optimizer: bool = False  # optimizer state and step on the CPU (ZeRO stages 1-3)
    config: Dict[str, Any] = field(default_factory=dict)  # merged into the generated DeepSpeed config

    def check(self) -> None:
        super().check()
        if self.offload_optimizer and self.zero_stage == 0:
            raise SettingError("offload_optimizer", True, message="{key}.offload_optimizer=true is not allowed with "
                               "{key}.zero_stage=0: DeepSpeed offloads the partitioned optimizer state of ZeRO; use "
                               "{key}.zero_stage=1, 2 or 3")


@dataclass
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
