"""Checkpoints through torch.distributed.checkpoint (DCP), what every engine that shards parameters as DTensors
writes (fsdp, the mesh): every rank writes its own shards, and DCP reshards them when the next run has another world
size or mesh; a single-file checkpoint (single, dp, ddp) is read as a full state dict, each rank keeping its shards."""
from __future__ import annotations

import contextlib
from pathlib import Path

from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_state_dict

from framework.checkpoints.position import Position
from framework.training.checkpoint_io import CheckpointFormat, CheckpointIO
from framework.training.dcp import load_sharded, save_sharded, sharded_state

DCP = CheckpointFormat("dcp", ("dcp", "file"), sharded=True, reshards=True)


class DcpCheckpoints(CheckpointIO):
    """torch.distributed.checkpoint: one shard per rank; reads a single-file checkpoint (single, ddp, dp) as a full
    state dict, each rank keeping its shards."""

    format = DCP

    def __init__(self, rank: int, world_size: int, cuda_devices: list[int], cpu_offload: bool):
        super().__init__(rank, world_size, cuda_devices)
        self.cpu_offload = cpu_offload

    def full_model_state(self, module: nn.Module) -> dict | None:
        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.is_main else None

    def save_shards(self, folder: Path, tag: str, model: nn.Module, optimizer) -> None:
        save_sharded(self.shard_state(model, optimizer), folder / tag)

    def shard_state(self, model: nn.Module, optimizer) -> dict:
        return sharded_state(model, optimizer)

    def load_shards(self, folder: Path, tag: str, model: nn.Module, optimizer) -> None:
        """DCP reads the shards this rank needs under this run's sharding, whatever world size wrote them."""
        load_sharded(model, optimizer, folder / tag)

    def restore_file(self, state: dict, module: nn.Module, optimizer, scaler) -> tuple[Position, dict]:
        """A single-file checkpoint holds the full model and a plain optimizer state dict (parameters by index, in
        model.parameters() order)."""
        names = [name for name, _ in module.named_parameters()]
        saved = state["optimizer"]
        by_name = {
            "state": {names[i]: s for i, s in saved["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]],
        }
        with buffers_in_cpu_memory(module, self.cpu_offload):
            set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=by_name,
                           options=StateDictOptions(full_state_dict=True))
        return self.progress(state)


@contextlib.contextmanager
def buffers_in_cpu_memory(model: nn.Module, offloaded: bool):
    """With cpu_offload the parameters' shards live in CPU memory while buffers (BatchNorm's statistics) stay on the
    GPU, and loading a full state dict refuses a model on two devices ("Multiple devices found"): the buffers join
    the parameters in CPU memory for the load and go back afterwards."""
    buffers = list(model.buffers()) if offloaded else []
    devices = [b.device for b in buffers]
    for b in buffers:
        b.data = b.data.cpu()
    try:
        yield
    finally:
        for b, device in zip(buffers, devices):
            b.data = b.data.to(device)
