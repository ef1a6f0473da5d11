"""How an engine's model and optimizer go into a checkpoint and come back (framework/checkpoints/ writes the files,
commits them and picks one to resume; framework/training/checkpointing.py decides when). FileCheckpoints: rank 0
writes model + optimizer into one .pt, which holds global state and so resumes on any world size. An engine that
shards them (fsdp's DCP, DeepSpeed ZeRO) writes a folder of shards from every rank; its format is recorded in the
manifest, and a checkpoint is only resumed by a strategy that reads that format."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from framework.checkpoints.position import Position
from framework.checkpoints.state import restore_progress
from framework.training.dcp import load_sharded


@dataclass(frozen=True)
class CheckpointFormat:
    """What a strategy's checkpoints are, known before any worker starts (the driver checks a resume against it)."""

    name: str  # recorded in each manifest
    readable: tuple[str, ...]  # formats it resumes
    sharded: bool = False  # every rank writes shards into a folder (save_shards)
    reshards: bool = True  # its checkpoints load into another world size (False: the driver refuses that)


FILE = CheckpointFormat("file", ("file", "dcp"))  # reads a sharded engine's DCP checkpoint too, every rank all of it


class CheckpointIO:
    """One .pt of global state, written by rank 0 (single, dp, ddp, horovod; any engine that keeps every parameter
    whole on every rank). A sharding engine subclasses it. It knows the rank and world it runs in: (rank, world_size,
    cuda_devices) of this process."""

    format = FILE

    def __init__(self, rank: int, world_size: int, cuda_devices: list[int]):
        self.rank, self.world_size, self.cuda_devices = rank, world_size, cuda_devices

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def full_model_state(self, module: nn.Module) -> dict | None:
        """Every rank calls it (a sharding engine gathers): the user's module's whole state dict in CPU memory on
        rank 0, None elsewhere (what weights/*.pt hold)."""
        if not self.is_main:
            return None
        return {k: v.detach().cpu() for k, v in module.state_dict().items()}

    def model_and_optimizer(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        """Rank 0, for a single-file checkpoint: the user's module's and the optimizer's state dicts."""
        return {"model": module.state_dict(), "optimizer": optimizer.state_dict()}

    def restore_file(self, state: dict, module: nn.Module, optimizer: torch.optim.Optimizer,
                     scaler) -> tuple[Position, dict]:
        """Every rank: model, optimizer and loss scaler from a single-file checkpoint; its position and totals."""
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])  # moves the state to each parameter's device
        if scaler and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        return self.progress(state)

    def progress(self, state: dict) -> tuple[Position, dict]:
        return restore_progress(state, self.rank, self.world_size, self.cuda_devices)

    def save_shards(self, folder: Path, tag: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Every rank (sharded formats): write this rank's shards of model and optimizer into folder/tag."""
        raise NotImplementedError(f"{self.format.name} checkpoints are single files")

    def shard_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        """Every rank (the DCP formats): what save_shards writes, as the state dict DCP takes (written behind the
        loop with trainer.async_checkpoint: framework/training/async_save.py)."""
        raise NotImplementedError(f"{self.format.name} checkpoints are not written through DCP")

    def load_shards(self, folder: Path, tag: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Every rank: model and optimizer from a sharded (DCP) checkpoint folder/tag (framework/training/dcp.py; fsdp
        and the mesh engines write them); here each rank loads every parameter whole, into the module inside its
        engine's wrapper (DDP, DataParallel)."""
        load_sharded(getattr(model, "module", model), optimizer, folder / tag)
