"""FSDP2 on the mesh's data-parallel axes: which modules are its units, and how fully_shard goes on them (one way,
so that a fix to how FSDP2 is applied lands once).

The units are the model's blocks (framework/models/blocks.py: the choice activation checkpointing shares), or
strategy.shard_modules' classes, innermost first, the root last. A parameter shared by two modules (an LM head tied
to the token embedding) must live in one unit, so modules holding a tied parameter are left to the enclosing unit
(the root). Under a low-precision compute dtype (bf16), a module with running statistics (BatchNorm) is a unit of its
own kept in fp32, sharded before the units around it: the policy would cast its weight but not its statistics, and
batch_norm refuses the mix; its input is cast up and its output down to the compute dtype for the layers after it."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy, fully_shard

from framework.common.errors import ConfigError
from framework.models.blocks import auto_units, innermost_first, named_units


def with_running_statistics(model: nn.Module) -> list[nn.Module]:
    """BatchNorm (any dimension, SyncBatchNorm, InstanceNorm with track_running_stats): a low-precision parameter
    policy casts its weight but not its running statistics, and batch_norm refuses the mix ("expected scalar type
    BFloat16 but found Float", torchtitan#674)."""
    return [m for m in model.modules() if m is not model and isinstance(getattr(m, "running_mean", None), torch.Tensor)]


def tied_parameters(model: nn.Module, units: list[nn.Module]) -> dict[str, list[str]]:
    """Parameters registered under more than one unit (the root counts as one): name -> the names it has."""
    unit_names = _unit_names(model, units)
    placed: dict[int, dict[str, int]] = {}  # id(parameter) -> its names -> id of the innermost unit holding it
    for name, p in model.named_parameters(remove_duplicate=False):
        placed.setdefault(id(p), {})[name] = _innermost(unit_names, name, id(model))
    return {min(names): sorted(names) for names in placed.values() if len(set(names.values())) > 1}


def _unit_names(model: nn.Module, units: list[nn.Module]) -> dict[str, int]:
    ids = {id(u) for u in units}
    return {name: id(m) for name, m in model.named_modules() if id(m) in ids}


def _innermost(unit_names: dict[str, int], parameter: str, default):
    """The id of the innermost unit holding the parameter of this name ('a.b.c.weight': a.b.c, then a.b, then a)."""
    parts = parameter.split(".")[:-1]
    prefixes = (".".join(parts[:i]) for i in range(len(parts), 0, -1))
    return next((unit_names[prefix] for prefix in prefixes if prefix in unit_names), default)


def without_tied(model: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    """The units less the innermost one around each tied parameter's names, until no parameter is in two units (its
    parameters fall to the unit around it, at last the root)."""
    units = list(units)
    while True:
        tied = tied_parameters(model, units)
        if not tied:
            return units
        unit_names = _unit_names(model, units)
        dropped = {_innermost(unit_names, name, None) for names in tied.values() for name in names}
        units = [u for u in units if id(u) not in dropped]


def check_shard_modules(model: nn.Module, names: list[str]) -> None:
    """ConfigError unless each of strategy.shard_modules' classes is in the model and no tied parameter spans two
    of their units."""
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


def shard_units(model: nn.Module, class_names: list[str] | None) -> list[nn.Module]:
    """The modules FSDP2 shards (and all-gathers) as one unit each, innermost first; the root comes last
    (strategy.shard_modules' classes, or each block holding parameters: containers are descended into, tied
    parameters stay in one unit)."""
    units = auto_units(model) if class_names is None else named_units(model, class_names)
    return innermost_first(model, without_tied(model, units))


@dataclass(frozen=True)
class ShardPrecision:
    """What FSDP2's MixedPrecisionPolicy does with the parameters and gradients."""

    compute: torch.dtype | None = None  # parameters cast to it for forward and backward; None: as they are (fp32)
    reduce: torch.dtype | None = None  # gradients reduce-scattered in it; None: in the compute dtype

    @classmethod
    def of(cls, precision: str) -> "ShardPrecision":
        """trainer.precision's policy: bf16 parameters for compute, gradients reduced in fp32 (the sharded fp32 master
        copy is what steps; reduce_dtype is also what an accumulation's gradients are held in between micro-batches,
        so compression casts on the wire only: framework/strategies/mesh/fsdp_wire.py); fp32: no casts."""
        compute = {"bf16": torch.bfloat16}.get(precision)
        return cls(compute, torch.float32 if compute else None)

    def policy(self) -> MixedPrecisionPolicy:
        return MixedPrecisionPolicy(param_dtype=self.compute, reduce_dtype=self.reduce)

    def norm_policy(self) -> MixedPrecisionPolicy:
        """A module with running statistics: fp32 throughout, its output cast back to the compute dtype."""
        return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=self.compute)


def shard_with_fsdp2(root: nn.Module, units: list[nn.Module], mesh: DeviceMesh, precision: ShardPrecision,
                     reshard_after_forward: bool, offload: OffloadPolicy | None = None) -> list[nn.Module]:
    """fully_shard on `units` (innermost first, as framework/models/blocks.py's innermost_first orders them) and then
    on `root`, over `mesh`, in place. Returns the modules kept in fp32 as units of their own (empty in fp32)."""
    options = dict(mesh=mesh, reshard_after_forward=reshard_after_forward, offload_policy=offload or OffloadPolicy())
    norms = with_running_statistics(root) if precision.compute is not None else []
    for norm in norms:
        fully_shard(norm, mp_policy=precision.norm_policy(), **options)
    for unit in units:
        if not any(unit is norm for norm in norms):
            fully_shard(unit, mp_policy=precision.policy(), **options)
    fully_shard(root, mp_policy=precision.policy(), **options)
    return norms
