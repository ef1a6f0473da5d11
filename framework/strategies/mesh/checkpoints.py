"""The mesh engine's checkpoints: DCP shards (framework/training/dcp.py, fsdp's layout) of the pieces this rank holds,
keyed by the whole model's names, so any mesh (or a single-file engine) reads them: DCP gives each reader the slices
its own sharding needs. A tied copy's optimizer state is written under the parameter's first name, as one process
writes it (both pipeline holders write the same values, and DCP keeps one). weights/*.pt: the whole model, each
parameter made whole in its stage and sent from the stage's first rank to rank 0, one tensor at a time."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
from torch.distributed.tensor import DTensor

from framework.checkpoints.position import Position
from framework.training.checkpoint_io import CheckpointFormat, CheckpointIO
from framework.training.dcp import load_sharded, save_sharded, sharded_state
from framework.training.engine import ProcessGroup

# every mesh but the 1-D replicate one (whose DDP writes one file); it reads a single-file checkpoint too
DCP = CheckpointFormat("dcp", ("dcp", "file"), sharded=True, reshards=True)


class MeshCheckpoints(CheckpointIO):
    format = DCP

    def __init__(self, group: ProcessGroup, module: nn.Module, whole: "WholeModel", canonical: dict[str, str], *,
                 gathers: bool, cpu_offload: bool):
        super().__init__(group.rank, group.world_size, group.cuda_devices)
        self.cpu_offload = cpu_offload
        self.module = module  # the pieces this rank holds, under the whole model's names
        self.whole = whole
        # a name this rank holds a tied copy under -> the name checkpoints use for it (where they differ)
        self.renamed = {held: name for held, name in canonical.items() if held != name}
        self.gathers = gathers  # this rank's stage slice sends the whole stage to rank 0 (dp and tp coordinate 0)

    def save_shards(self, folder: Path, tag: str, model: nn.Module, optimizer) -> None:
        save_sharded(self.shard_state(model, optimizer), folder / tag)

    def shard_state(self, model: nn.Module, optimizer) -> dict:
        state = sharded_state(self.module, optimizer)
        return {"model": state["model"], "optimizer": self._to_saved(state["optimizer"])}

    def load_shards(self, folder: Path, tag: str, model: nn.Module, optimizer) -> None:
        load_sharded(self.module, optimizer, folder / tag, self._to_saved, self._from_saved)

    def _to_saved(self, optimizer_state: dict) -> dict:
        return {_renamed(key, self.renamed): value for key, value in optimizer_state.items()}

    def _from_saved(self, optimizer_state: dict) -> dict:
        back = {name: held for held, name in self.renamed.items()}
        return {_renamed(key, back): value for key, value in optimizer_state.items()}

    def full_model_state(self, module: nn.Module) -> dict | None:
        """Every rank: each tensor made whole within its stage (a collective over tensor and data-parallel peers),
        kept in CPU memory by the stage's first rank, then sent to rank 0 one tensor at a time. Not the whole stage
        through an object gather: over nccl that pickles into CUDA byte buffers the size of the largest stage on
        every GPU, rank 0's world_size of them."""
        mine = {}
        for name, tensor in self.module.state_dict().items():
            whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            if self.gathers:
                mine[name] = whole.detach().cpu()
        if self.world_size == 1:
            return {key: mine[key] for key in self.whole.state_keys if key in mine}
        held = [None] * self.world_size  # what each stage's first rank holds: names, shapes, dtypes (small)
        dist.all_gather_object(held, [(name, tuple(t.shape), t.dtype) for name, t in mine.items()])
        owner, meta = {}, {}
        for rank, entries in enumerate(held):
            for name, shape, dtype in entries:
                owner.setdefault(name, rank)  # a tensor outside the pieces (root-level) is sent by its first holder
                meta.setdefault(name, (shape, dtype))
        device = torch.device("cuda", self.cuda_devices[0]) if self.cuda_devices else torch.device("cpu")
        merged = dict(mine) if self.is_main else None
        for key in self.whole.state_keys:  # the same order on every rank: each send meets its receive
            sender = owner.get(key)
            if sender is None or sender == 0:
                continue
            if self.rank == sender:
                dist.send(mine[key].contiguous().to(device), dst=0)
            elif self.is_main:
                shape, dtype = meta[key]
                received = torch.empty(shape, dtype=dtype, device=device)
                dist.recv(received, src=sender)
                merged[key] = received.cpu()
        if not self.is_main:
            return None
        return {key: merged[key] for key in self.whole.state_keys if key in merged}

    def restore_file(self, state: dict, module: nn.Module, optimizer, scaler) -> tuple[Position, dict]:
        """A single-file checkpoint (single, ddp): the whole model's state and its optimizer's by parameter index;
        each rank takes what it holds, shards made by set_state_dict."""
        held = set(self.module.state_dict())
        back = {name: held_name for held_name, name in self.renamed.items()}
        names = [back.get(name, name) for name in self.whole.parameter_names]  # by index, as this rank holds them
        saved = state["optimizer"]
        by_name = {"state": {names[i]: s for i, s in saved["state"].items() if names[i] in held},
                   "param_groups": [{**g, "params": [names[i] for i in g["params"] if names[i] in held]}
                                    for g in saved["param_groups"]]}
        model_state = {key: value for key, value in state["model"].items() if key in held}
        with buffers_in_cpu_memory(self.module, self.cpu_offload):
            set_state_dict(self.module, optimizer, model_state_dict=model_state, optim_state_dict=by_name,
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


class WholeModel:
    """What the whole model's state looks like, read before it is cut into stages: its state dict's keys in order
    and its parameters' names in parameters() order (a single-file checkpoint's optimizer counts by that order)."""

    def __init__(self, model: nn.Module):
        self.state_keys = list(model.state_dict())
        self.parameter_names = [name for name, _ in model.named_parameters()]


def _renamed(key: str, names: dict[str, str]) -> str:
    """A flattened optimizer key ('state.head.weight.exp_avg', 'param_groups.head.weight.lr') with its parameter
    name replaced where `names` has it."""
    kind, _, rest = key.partition(".")
    for old, new in names.items():
        if rest.startswith(old + "."):
            return f"{kind}.{new}{rest[len(old):]}"
    return key
