"""The mesh's shape: the degrees in torchtitan's order, outermost first (pp, dp_replicate, dp_shard, tp: tensor
parallel peers are neighbouring ranks, on one node where it has several GPUs), and what a rank's coordinates mean.
Plain arithmetic: the driver checks with it before any worker starts, the workers build their DeviceMesh from it."""
from __future__ import annotations

from dataclasses import dataclass

NAMES = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class MeshShape:
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

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

    def describe(self) -> str:
        """e.g. 'dp_shard 2 x tp 2' (the axes with more than one rank; 'one rank' when none)."""
        parts = [f"{name} {size}" for name, size in zip(NAMES, self.sizes) if size > 1]
        return " x ".join(parts) or "one rank"
