"""Sharded checkpoints through torch.distributed.checkpoint (DCP), one layout for every engine that writes or reads
them (fsdp, the mesh engines of strategy=tp / pp, and the single-file engines reading one): the model's and the
optimizer's state keyed by the whole model's parameter names, the optimizer's flattened (`state.<name>.exp_avg`,
`param_groups.<name>.lr`: torchtitan's choice), so ranks that hold different parameters (pipeline stages) never
write one key with different values. DCP reads each rank's share under the reader's own sharding, whatever wrote
it."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

import torch.distributed as dist
from torch import nn

Rename = Callable[[dict], dict]  # a state dict's keys as a checkpoint holds them (and back)


def sharded_state(model: nn.Module, optimizer) -> dict:
    """This rank's model and optimizer state (its shards: DTensors where it holds a share)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict  # slow: see _flat()

    model_state, optimizer_state = get_state_dict(model, optimizer, options=_flat())
    return {"model": model_state, "optimizer": optimizer_state}


def save_sharded(state: dict, path: Path) -> None:
    import torch.distributed.checkpoint as dcp  # slow: see _flat()

    _disk_error_as_itself(lambda: dcp.save(state, storage_writer=_writer_class()(str(path))))


def written(future) -> None:
    """Waits for DcpWrites.async_save's future; a disk's error raised as in save_sharded."""
    _disk_error_as_itself(future.result)


def _disk_error_as_itself(save: Callable[[], object]) -> None:
    """save(), a DCP save. DCP gathers every rank's failure into one CheckpointException, raised on every rank once
    every rank's write has ended; the first rank's OSError there (disk full, a folder turned read-only) is raised as
    itself, so a shard folder that does not fit fails as a single file does (framework/checkpoints/store.py)."""
    try:
        save()
    except BaseException as exc:
        failures = getattr(exc, "failures", None) or {}
        errors = [failures[rank][0] for rank in sorted(failures) if isinstance(failures[rank][0], OSError)]
        if not errors:
            raise
        raise errors[0] from None


@functools.cache
def _writer_class():
    """DCP's FileSystemWriter, with the disk's own error where torch.save's C++ writer hides it: a tensor that does not
    fit raises RuntimeError('[enforce fail at inline_container.cc] unexpected pos ...') whose context is the OSError
    (ENOSPC); DCP sends each rank's failure to the others pickled, which drops the context, so a full disk came out as
    DCP's CheckpointException whenever a tensor, not a bytes item, was the write that did not fit."""
    from torch.distributed.checkpoint import FileSystemWriter  # slow: see _flat()

    class DiskErrorsWriter(FileSystemWriter):
        def write_data(self, plan, planner):
            try:
                return super().write_data(plan, planner)
            except RuntimeError as exc:
                if isinstance(exc.__context__, OSError):
                    raise exc.__context__ from None
                raise

    return DiskErrorsWriter


class DcpWrites:
    """Sharded checkpoints written behind the loop (trainer.async_checkpoint, framework/training/async_save.py):
    torch.distributed.checkpoint.async_save stages this rank's state into CPU memory on the caller's thread, then
    writes it on DCP's own thread, whose planning and commit are collectives: they run over a gloo group of their own
    (made here, by every rank together), never the training's group, whose collectives go on meanwhile."""

    def __init__(self, stager):
        self.group = dist.new_group(backend="gloo")
        self.stager = stager  # async_save.dcp_stager's: staged on the caller's thread

    def async_save(self, state: dict, path: Path):
        """A future that completes once this rank's shards (and, on rank 0, DCP's metadata, so every rank's) are
        written."""
        import torch.distributed.checkpoint as dcp  # slow: see _flat()

        return dcp.async_save(state, storage_writer=_writer_class()(str(path)), process_group=self.group,
                              async_stager=self.stager)

    def close(self) -> None:
        self.stager.close()


def load_sharded(model: nn.Module, optimizer, path: Path, to_saved: Rename = dict, from_saved: Rename = dict) -> None:
    """Every rank: its share of model and optimizer from a DCP checkpoint. to_saved/from_saved: how this rank's
    optimizer keys are named in the checkpoint (a tied copy under the name its first holder writes)."""
    import torch.distributed.checkpoint as dcp  # slow: see _flat()
    from torch.distributed.checkpoint.state_dict import set_state_dict  # slow: see _flat()

    state = sharded_state(model, optimizer)
    saved = {"model": state["model"], "optimizer": to_saved(state["optimizer"])}
    dcp.load(saved, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=saved["model"],
                   optim_state_dict=from_saved(saved["optimizer"]), options=_flat())


def _flat():
    """The optimizer's state flattened (torchtitan's choice). torch.distributed.checkpoint is imported where it is
    used: it brings DTensor and sympy (~0.8 s), which a run writing single-file checkpoints (single, dp, ddp,
    horovod: they import this module to read a sharded one) never needs, least of all before its first step."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions  # slow: see above

    return StateDictOptions(flatten_optimizer_state_dict=True)
