"""The optimizer's multi-tensor kernels on a mesh. Tensor parallel without FSDP2 leaves the parameters its plan does not
split (embeddings, norms, a head) plain tensors beside DTensors. On CUDA torch's optimizers default to foreach
kernels, which group a param group's tensors by device and dtype only, so one torch._foreach_* call gets both kinds,
and DTensor refuses it ("got mixed torch.Tensor and DTensor"); on the CPU they never take that path, so a CPU run
cannot show it. A group that mixes the two runs torch's per-tensor loop instead (on a CPU it does anyway). Under
FSDP2 every parameter is a DTensor, and DTensors of different meshes (FSDP2's dp and its 2-D dp x tp) are taken
together: those groups keep torch's choice."""
from __future__ import annotations

from torch.distributed.tensor import DTensor

from framework.common.errors import ConfigError

MULTI_TENSOR = ("foreach", "fused")


def mixes_plain_and_dtensors(params) -> bool:
    return len({isinstance(p, DTensor) for p in params}) > 1


def per_tensor_where_mixed(optimizer) -> list[int]:
    """In place: foreach=False on each param group that mixes plain tensors and DTensors, where torch would choose
    (foreach unset); one the config asked foreach or fused kernels of is refused. Returns those groups' indices."""
    changed = []
    for index, group in enumerate(optimizer.param_groups):
        if not mixes_plain_and_dtensors(group["params"]):
            continue
        for key in MULTI_TENSOR:
            if group.get(key):
                raise ConfigError(
                    f"optimizer.{key}=true is not allowed with this mesh: param group {group.get('name', index)} "
                    "holds both plain parameters and tensor-parallel DTensors, which torch's multi-tensor kernels "
                    f"refuse to take together; leave optimizer.{key} unset (the engine turns it off for such groups), "
                    "or add FSDP2 (strategy.dp_shard > 1: every parameter a DTensor)")
        if "foreach" in group:
            group["foreach"] = False
            changed.append(index)
    return changed
