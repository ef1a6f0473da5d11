"""FSDP2 applied to a model: the one way of every engine that shards with it (strategy=fsdp over all its ranks, the
mesh engine over its data-parallel axes), so that a fix to how FSDP2 is applied lands once.

fully_shard goes on each unit, innermost first, then on the root. Under a low-precision compute dtype (bf16), a
module with running statistics (BatchNorm) is a unit of its own kept in fp32, sharded before the units around it: the
policy would cast its weight but not its statistics, and batch_norm refuses the mix (framework/strategies/
fsdp_units.py); its input is cast up and its output down to the compute dtype for the layers after it."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy, fully_shard

from framework.strategies.mesh.fsdp_units import with_running_statistics


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
