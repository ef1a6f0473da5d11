"""Sharded checkpoints through torch.distributed.checkpoint (DCP), one layout for every engine that writes or reads
them (fsdp, the mesh engines of strategy=tp / pp, and the single-file engines reading one): the model's and the
optimizer's state keyed by the whole model's parameter names, the optimizer's flattened (`state.<name>.exp_avg`,
`param_groups.<name>.lr`: torchtitan's choice), so ranks that hold different parameters (pipeline stages) never
write one key with different values. DCP reads each rank's share under the reader's own sharding, whatever wrote
it."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

FLAT = StateDictOptions(flatten_optimizer_state_dict=True)

Rename = Callable[[dict], dict]  # a state dict's keys as a checkpoint holds them (and back)


def sharded_state(model: nn.Module, optimizer) -> dict:
    """This rank's model and optimizer state (its shards: DTensors where it holds a share)."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=FLAT)
    return {"model": model_state, "optimizer": optimizer_state}


def save_sharded(state: dict, path: Path) -> None:
    dcp.save(state, checkpoint_id=str(path))


def load_sharded(model: nn.Module, optimizer, path: Path, to_saved: Rename = dict, from_saved: Rename = dict) -> None:
    """Every rank: its share of model and optimizer from a DCP checkpoint. to_saved/from_saved: how this rank's
    optimizer keys are named in the checkpoint (a tied copy under the name its first holder writes)."""
    state = sharded_state(model, optimizer)
    saved = {"model": state["model"], "optimizer": to_saved(state["optimizer"])}
    dcp.load(saved, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=saved["model"],
                   optim_state_dict=from_saved(saved["optimizer"]), options=FLAT)
