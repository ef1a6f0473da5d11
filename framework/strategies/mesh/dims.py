"""The mesh's degrees, as torchtitan's parallel_dims: in its order, outermost first (pp, dp_replicate, dp_shard, tp:
tensor parallel peers are neighbouring ranks, on one node where it has several GPUs), a degree of -1 being the rest of
the world, and what a rank's coordinates mean (plain arithmetic: the driver checks with it before any worker starts);
then the process group mesh workers join, one DeviceMesh over torch.distributed's, with its sub-meshes by use."""
from __future__ import annotations

from dataclasses import dataclass, replace

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from framework.common.errors import ConfigError
from framework.config.strategy_options import REST_OF_THE_WORLD
from framework.strategies.groups import TorchGroup

NAMES = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class MeshDims:
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    def filled(self, world: int) -> "MeshDims":
        """These degrees in a world of `world` workers: a degree of -1 becomes the workers divided by the other
        degrees; ConfigError when they do not divide them."""
        rest = [name for name in NAMES if getattr(self, name) == REST_OF_THE_WORLD]
        if not rest:
            return self
        others = 1
        for name in NAMES:
            others *= 1 if name in rest else getattr(self, name)
        if world % others:
            given = " x ".join(f"strategy.{n}={getattr(self, n)}" for n in NAMES if n not in rest)
            raise ConfigError(f"strategy.{rest[0]}=-1 is not allowed with {world} worker(s): the rest of the world is "
                              f"{world} / ({given} = {others}), which is not whole; use a number of workers that "
                              f"{others} divides (strategy.nproc_per_node), or set strategy.{rest[0]}")
        return replace(self, **{rest[0]: world // others})

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in NAMES)

    @property
    def workers(self) -> int:
        total = 1
        for size in self.sizes:
            total *= size
        return total

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: the batch is split over them, and each sees a different shard of the data."""
        return self.dp_replicate * self.dp_shard

    @property
    def sharded(self) -> bool:
        """FSDP2 runs over the data-parallel axes (sharding over dp_shard, replicas over dp_replicate)."""
        return self.dp_size > 1

    def coordinates(self, rank: int) -> dict[str, int]:
        """rank's place on each axis (row-major over NAMES, as init_device_mesh lays ranks out)."""
        coords, rest = {}, rank
        for name, size in reversed(list(zip(NAMES, self.sizes))):
            coords[name], rest = rest % size, rest // size
        return {name: coords[name] for name in NAMES}

    def dp_rank(self, rank: int) -> int:
        c = self.coordinates(rank)
        return c["dp_replicate"] * self.dp_shard + c["dp_shard"]


class MeshGroup(TorchGroup):
    """torch.distributed's default group (joined like ddp's), one DeviceMesh over it, and this rank's data-parallel
    place (ProcessGroup.dp_rank, dp_size: what the data loaders and the batch split read)."""

    mesh: DeviceMesh
    dims: MeshDims

    def on_mesh(self, dims: MeshDims) -> "MeshGroup":
        """This rank of torch.distributed's default group, placed on the mesh of `dims` (every rank calls it)."""
        self.dims = dims
        # every axis, also those of size 1: fully_shard takes the 2-D (dp_replicate, dp_shard) mesh for HSDP
        self.mesh = init_device_mesh(self.device.type, dims.sizes, mesh_dim_names=NAMES)
        self.coords = dims.coordinates(self.rank)
        self.dp_rank, self.dp_size = dims.dp_rank(self.rank), dims.dp_size
        return self

    def axis(self, name: str) -> DeviceMesh:
        """One degree's sub-mesh: tensor parallel's plan runs over "tp", the pipeline's sends over "pp"."""
        return self.mesh[name]

    def dp_mesh(self) -> DeviceMesh:
        """What FSDP2 shards over: dp_shard, or (dp_replicate, dp_shard) for HSDP (replicas of a sharded model)."""
        return self.mesh["dp_replicate", "dp_shard"] if self.dims.dp_replicate > 1 else self.mesh["dp_shard"]
