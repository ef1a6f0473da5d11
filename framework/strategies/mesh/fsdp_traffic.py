"""FSDP2's gradient bytes counted (framework/telemetry/traffic.py): the engines that shard with FSDP2 (fsdp, the
mesh's dp_shard) route every unit's reduce-scatter through a counter, and say so as CountsTraffic does. Counted only
where every parameter is sharded over one axis: with tensor parallel or HSDP's replicas, other collectives carry
gradients too."""
from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from framework.strategies.mesh.fsdp_wire import WireDtype
from framework.telemetry.traffic import CountedReduceScatter, Traffic


def counted_reduce_scatters(model: nn.Module, compression: str, wire: WireDtype | None = None) -> Traffic | None:
    """The counter of model's reduce-scatters, each unit's set to go through it (after `wire`'s cast, where
    strategy.compression casts: what travels is what is counted); None where they are not all of the gradients'
    traffic (then `wire` alone, if any)."""
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    params = list(model.parameters())
    if not units or not params or not all(isinstance(p, DTensor) and p.device_mesh.ndim == 1 for p in params):
        if wire is not None:
            for unit in units:
                unit.set_custom_reduce_scatter(wire)
        return None
    traffic = Traffic(str(compression))
    counted = CountedReduceScatter(traffic, params[0].element_size())
    for unit in units:
        unit.set_custom_reduce_scatter(wire.through(counted) if wire is not None else counted)
    return traffic
