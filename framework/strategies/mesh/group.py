"""The process group mesh workers join: torch.distributed's (joined like ddp's), one DeviceMesh over it, and this
rank's data-parallel place (ProcessGroup.dp_rank, dp_size: what the data loaders and the batch split read)."""
from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from framework.strategies.groups import TorchGroup
from framework.strategies.mesh.shape import NAMES, MeshShape


class MeshGroup(TorchGroup):
    mesh: DeviceMesh
    shape: MeshShape

    def on_mesh(self, shape: MeshShape) -> "MeshGroup":
        """This rank of torch.distributed's default group, placed on the mesh of `shape` (every rank calls it)."""
        self.shape = shape
        # every axis, also those of size 1: fully_shard takes the 2-D (dp_replicate, dp_shard) mesh for HSDP
        self.mesh = init_device_mesh(self.device.type, shape.sizes, mesh_dim_names=NAMES)
        self.coords = shape.coordinates(self.rank)
        self.dp_rank, self.dp_size = shape.dp_rank(self.rank), shape.dp_size
        return self

    def axis(self, name: str) -> DeviceMesh:
        return self.mesh[name]

    def dp_mesh(self) -> DeviceMesh:
        """What FSDP2 shards over: dp_shard, or (dp_replicate, dp_shard) for HSDP (replicas of a sharded model)."""
        return self.mesh["dp_replicate", "dp_shard"] if self.shape.dp_replicate > 1 else self.mesh["dp_shard"]
