"""trainer.async_checkpoint: the one place that decides whether a checkpoint is written on the loop's thread or
behind it, while training goes on (framework/training/checkpointing.py says what is written; framework/checkpoints/
how it is committed).

Behind the loop, the state is first copied (staged) into CPU memory on the loop's thread, so the steps that follow
cannot change what is written; then a thread of its own writes it: the single-file format through the same atomic
write, checksum, manifest-last commit and pruning as a blocking save, the DCP formats (fsdp, the mesh engines)
through torch.distributed.checkpoint.async_save over a gloo group of their own. At most one write is in flight: the
next save, the end of the run and a stop wait for it, and only then does the run learn (every rank together)
whether it was committed."""
from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from framework.checkpoints.disk import CheckpointNotWritten
from framework.common.errors import ConfigError, first_line

# the checkpoint formats that can be written behind the loop: DeepSpeed's own (save_checkpoint) writes on its caller
WRITTEN_BEHIND = ("file", "dcp")


def async_refusal(wanted: bool, format_name: str, strategy: str) -> None:
    """ConfigError, in one line, for trainer.async_checkpoint=true with a strategy whose checkpoints cannot be
    written behind the loop."""
    if not wanted or format_name in WRITTEN_BEHIND:
        return
    raise ConfigError(f"trainer.async_checkpoint=true is not allowed with strategy={strategy}: its {format_name} "
                      "checkpoints are written by the engine itself on the loop's thread (only the "
                      f"{' and '.join(WRITTEN_BEHIND)} formats are written behind it); allowed: false")


def pinned(cuda: bool) -> bool:
    """Whether staged copies go to pinned (page-locked) CPU memory: on GPUs, where it makes the copy out of device
    memory fast and lets the writer read it while training goes on; on CPU workers there is nothing to pin."""
    return cuda


def staged(value, pin: bool = False):
    """A copy of a checkpoint's state in CPU memory that later steps cannot change: tensors copied (into pinned
    memory with pin), containers rebuilt, everything else deep-copied."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if pin:
            return torch.empty_like(value, device="cpu").pin_memory().copy_(value)
        return value.to("cpu", copy=True)
    if isinstance(value, dict):
        return type(value)((k, staged(v, pin)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(staged(v, pin) for v in value)
    return copy.deepcopy(value)


def dcp_stager(cuda: bool):
    """torch.distributed.checkpoint's stager for async_save: staged on the caller's thread (the loop's), into pinned
    memory on GPUs; one stager for the run, so its CPU buffers are reused (only one write is ever in flight)."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions  # slow: see training/dcp.py

    return DefaultStager(StagingOptions(use_pinned_memory=pinned(cuda), use_shared_memory=False,
                                        use_async_staging=False, use_non_blocking_copy=False))


@dataclass(frozen=True)
class Outcome:
    """What became of one rank's write of the checkpoint of `step`: its path once committed (rank 0's; None on a rank
    with nothing to commit), or the problem in one line."""

    step: int
    path: Path | None = None
    problem: str | None = None
    explained: bool = False  # the problem names the newest complete checkpoint already (CheckpointNotWritten)


class CheckpointWrites:
    """At most one checkpoint write of this rank at a time: run at once on the caller's thread (behind=False, the
    blocking save), or on a thread of its own (behind=True). Its outcome is read once, by wait()."""

    def __init__(self, behind: bool):
        self.behind = behind
        self._thread: threading.Thread | None = None
        self._outcome: Outcome | None = None
        self._started: int | None = None  # the step of the write started and not yet waited for

    def start(self, step: int, write: Callable[[], Path | None]) -> None:
        """write(): the checkpoint's path once committed. A blocking write's CheckpointNotWritten (disk full) is its
        outcome and any other error raises here, as before; behind the loop every error is the outcome."""
        if self._started is not None:
            raise RuntimeError(f"the checkpoint of step {step} was started while the one of step {self._started} "
                               "was not waited for")
        self._started = step
        if not self.behind:
            try:
                self._outcome = Outcome(step, write())
            except CheckpointNotWritten as exc:
                self._outcome = Outcome(step, problem=str(exc), explained=True)
            return
        self._thread = threading.Thread(target=self._write, args=(step, write), name=f"checkpoint-step-{step}",
                                        daemon=True)  # a process that ends without waiting leaves no commit
        self._thread.start()

    def _write(self, step: int, write: Callable[[], Path | None]) -> None:
        try:
            self._outcome = Outcome(step, write())
        except CheckpointNotWritten as exc:  # disk full: what it needed, and the newest complete checkpoint
            self._outcome = Outcome(step, problem=str(exc), explained=True)
        except BaseException as exc:  # said by the loop's thread at the next wait, on every rank
            first = first_line(exc)
            self._outcome = Outcome(step, problem=f"{type(exc).__name__}: {first}" if first else type(exc).__name__)

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> Outcome | None:
        """The outcome of the write started last (after it ended), or None when none was started since the last wait."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        outcome, self._outcome, self._started = self._outcome, None, None
        return outcome
