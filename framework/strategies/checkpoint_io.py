"""How a strategy's model and optimizer go into a checkpoint and come back (framework/checkpoints/ writes the files,
commits them and picks one to resume). FileCheckpoints: rank 0 writes model + optimizer into one .pt, which holds
global state and so resumes on any world size. An engine that shards them (fsdp's DCP, DeepSpeed ZeRO) writes a
folder of shards from every rank: `sharded`, with save_shards/load_shards; its `format` is recorded in the
manifest, and a checkpoint is only resumed by a strategy that reads that format."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from framework.checkpoints.position import Position
from framework.checkpoints.state import restore_progress

if TYPE_CHECKING:
    from framework.strategies.base import Strategy, Wrapped


class CheckpointIO:
    format = "file"
    sharded = False  # every rank writes shards into a folder through save_shards
    reshards = True  # its checkpoints load into another world size; False: the driver refuses that before starting

    def __init__(self, strategy: "Strategy"):
        self.strategy = strategy

    @property
    def readable_formats(self) -> tuple[str, ...]:
        return (self.format,)

    def full_model_state(self, wrapped: "Wrapped") -> dict | None:
        """Every rank calls it (a sharding engine gathers): the user's module's whole state dict in CPU memory on
        rank 0, None elsewhere (what weights/*.pt hold)."""
        if not self.strategy.is_main:
            return None
        return {k: v.detach().cpu() for k, v in self.strategy.unwrap(wrapped.model).state_dict().items()}

    def model_and_optimizer(self, wrapped: "Wrapped") -> dict:
        """Rank 0, for a single-file checkpoint: the user's module's and the optimizer's state dicts."""
        return {"model": self.strategy.unwrap(wrapped.model).state_dict(), "optimizer": wrapped.optimizer.state_dict()}

    def restore_file(self, state: dict, wrapped: "Wrapped") -> tuple[Position, dict]:
        """Every rank: model, optimizer and loss scaler from a single-file checkpoint; its position and totals."""
        self.strategy.unwrap(wrapped.model).load_state_dict(state["model"])
        wrapped.optimizer.load_state_dict(state["optimizer"])  # moves the state to each parameter's device
        scaler = wrapped.precision.scaler
        if scaler and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        return self.progress(state)

    def progress(self, state: dict) -> tuple[Position, dict]:
        s = self.strategy
        return restore_progress(state, s.rank, s.world_size, s.cuda_devices())

    def save_shards(self, folder: Path, tag: str, wrapped: "Wrapped") -> None:
        """Every rank (sharded formats): write this rank's shards of model and optimizer into folder/tag."""
        raise NotImplementedError(f"strategy={self.strategy.name} writes single-file checkpoints")

    def load_shards(self, folder: Path, tag: str, wrapped: "Wrapped") -> None:
        """Every rank (sharded formats): load model and optimizer shards from folder/tag."""
        raise NotImplementedError(f"strategy={self.strategy.name} reads single-file checkpoints")


class FileCheckpoints(CheckpointIO):
    """The default: one .pt of global state (single, dp, ddp, horovod)."""
