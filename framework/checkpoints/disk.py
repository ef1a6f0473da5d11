"""Room on disk for checkpoints: the error when one cannot be written (disk full, read-only folder) and the
driver's warning before training when the run folder cannot hold trainer.keep_checkpoints + 1 of them."""
from __future__ import annotations

import errno
import shutil
import threading
from pathlib import Path

import torch

from framework.data.batches import leaves


class CheckpointNotWritten(RuntimeError):
    """A checkpoint could not be written. Nothing of it is left behind; the message names the folder, the bytes
    it needed and the bytes free, and the last complete checkpoint."""


def free_bytes(path: Path) -> int:
    """Free bytes (for this user) of the filesystem that holds path, or would hold it once created."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def write_failure(name: str, folder: Path, needed: int, exc: OSError, last) -> str:
    """The one message for a checkpoint that could not be written; `last` is the newest complete one (or None)."""
    reason = exc.strerror or str(exc)
    code = errno.errorcode.get(exc.errno, "") if exc.errno else ""
    kept = (f"the last complete checkpoint is {last.path} (step {last.step}), intact and loadable: resume from it "
            "with trainer.resume=auto and this run's hydra.run.dir once the folder takes the next one"
            if last else "no checkpoint of this run had been written yet")
    return (f"checkpoint {name} could not be written to {folder}: {reason}{f' ({code})' if code else ''}; it needs "
            f"{needed:,} bytes and the filesystem there has {free_bytes(folder):,} bytes free. Nothing of it was "
            f"left behind; {kept}. Make room (or point hydra.run.dir at a larger disk, or lower "
            "trainer.keep_checkpoints)")


def remove_quietly(*paths: Path) -> None:
    """Take away a half-written file; on a folder that turned read-only this cannot succeed, and the error
    about the write is the one to report."""
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def tensor_bytes(obj) -> int:
    return sum(t.numel() * t.element_size() for t in leaves(obj))


def checkpoint_bytes(model: torch.nn.Module, make_optimizer) -> int:
    """About what one checkpoint of this model and optimizer holds: the model's state_dict, plus the optimizer's
    state after one step of zero gradients on a copy (Adam: two tensors per parameter, SGD with momentum one)."""
    model_bytes = tensor_bytes(model.state_dict())
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    try:
        optimizer = make_optimizer(params)
        optimizer.step()
    except Exception:  # an optimizer that needs more than a plain step (LBFGS: a closure): the model alone
        return model_bytes
    return model_bytes + tensor_bytes(optimizer.state_dict()["state"])


def space_warning(folder: Path, keep: int, existing: int, each: int) -> str | None:
    """The driver's warning when the checkpoint folder's filesystem cannot take the checkpoints this run will
    hold at once: keep + 1 while a new one is written before the oldest is pruned (those already there count)."""
    wanted = max(keep + 1 - existing, 1) * each
    free = free_bytes(folder)
    if free >= wanted:
        return None
    return (f"warning: {folder} has {free:,} bytes free, and this run's checkpoints need about {wanted:,} "
            f"(trainer.keep_checkpoints={keep} + 1 being written, {existing} already there, about {each:,} bytes "
            "each for this model and optimizer); a checkpoint that does not fit stops the run. Make room, point "
            "hydra.run.dir at a larger disk, or lower trainer.keep_checkpoints")


class OffWhenUnwritable:
    """A writer into the run folder that is not a checkpoint (rank 0's TensorBoard logger): its first OSError (disk
    full, folder read-only) becomes one warning and the writer is off for the rest of the run. Whether the run can
    go on is the next checkpoint's question, which every rank answers together (a failure here is rank 0's alone)."""

    def __init__(self, target, what: str, warn):
        self._target, self._what, self._warn, self._off = target, what, warn, False
        _quiet_tensorboard_writer_thread()

    def __getattr__(self, name: str):
        method = getattr(self._target, name)
        if not callable(method):
            return method

        def guarded(*args, **kwargs):
            if self._off:
                return None
            try:
                return method(*args, **kwargs)
            except OSError as exc:
                self._off = True
                self._warn(f"warning: {self._what} can no longer be written ({exc.strerror or exc}); it is off for "
                           "the rest of this run")
        return guarded


def _quiet_tensorboard_writer_thread() -> None:
    """TensorBoard writes events on a thread of its own, which dies with a traceback on an OSError before the next
    call re-raises it to us (OffWhenUnwritable reports it then, once)."""
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args):
        if not (isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread"):
            previous(args)
    hook.quiets_tensorboard = True
    threading.excepthook = hook
