"""The mesh's shape: the degrees in torchtitan's order, outermost first (pp, dp_replicate, dp_shard, tp: tensor
parallel peers are neighbouring ranks, on one node where it has several GPUs), and what a rank's coordinates mean.
Plain arithmetic: the driver checks with it before any worker starts, the workers build their DeviceMesh from it."""
from __future__ import annotations

from dataclasses import dataclass, replace

from framework.common.errors import ConfigError
from framework.config.strategy_options import REST_OF_THE_WORLD
NAMES = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class MeshShape:
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    def filled(self, world: int) -> "MeshShape":
        """This shape in a world of `world` workers: a degree of -1 becomes the workers divided by the other
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

    def describe(self) -> str:
        """e.g. 'dp_shard 2 x tp 2' (the axes with more than one rank; 'one rank' when none)."""
        parts = [f"{name} {size}" for name, size in zip(NAMES, self.sizes) if size > 1]
        return " x ".join(parts) or "one rank"
