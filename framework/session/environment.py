"""What a program that started this process as one of several ranks left in its environment (torchrun and the
launchers like it, SLURM or submitit tasks once mapped to torch's variables (slurm.py), horovodrun, and torch's
elastic agent for the workers hydra-dist starts itself), read once, for detect.py, which hands them out; and the facts
of this process that the workers it starts share out: its cores, its import path."""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from dataclasses import dataclass, replace

from framework.common.errors import ConfigError
from framework.session.slurm import adopt_scheduler_ranks, started_by_submitit

# Kinds of ranks, by the variables their starter leaves in each process's environment.
TORCH = "torch"  # torchrun, torch.distributed.launch, DeepSpeed's `deepspeed`, SLURM/submitit tasks: RANK, WORLD_SIZE, ...
HOROVOD = "horovod"  # horovodrun: HOROVOD_RANK, HOROVOD_SIZE, ...
_TORCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
_HOROVOD_VARS = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")
_SCHEDULERS = {"slurm": "SLURM tasks", "local": "submitit_local tasks"}


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks of one job, as the program that started them all said it."""

    kind: str  # TORCH or HOROVOD: whose variables, and so which strategies can train with these processes
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    scheduler: str | None = None  # 'slurm' or 'local' (submitit_local): a scheduler's tasks, mapped to ranks
    submitit: bool = False  # submitit started the tasks: it runs Hydra's job function in every one of them

    @property
    def started_by(self) -> str:
        """The starter as a user would name it, for messages."""
        if self.scheduler:
            return _SCHEDULERS.get(self.scheduler, self.scheduler)
        return "horovodrun" if self.kind == HOROVOD else "torchrun"


def read_ranks(environ) -> Ranks | None:
    """The ranks an environment (a mapping like os.environ) describes, or None when nobody started the process
    as one of several."""
    if all(name in environ for name in _TORCH_VARS):
        world = int(environ["WORLD_SIZE"])
        return Ranks(TORCH, int(environ["RANK"]), int(environ["LOCAL_RANK"]), world,
                     int(environ.get("LOCAL_WORLD_SIZE", world)))
    if all(name in environ for name in _HOROVOD_VARS):
        return Ranks(HOROVOD, int(environ["HOROVOD_RANK"]), int(environ["HOROVOD_LOCAL_RANK"]),
                     int(environ["HOROVOD_SIZE"]), int(environ["HOROVOD_LOCAL_SIZE"]))
    return None


@functools.cache
def _ranks() -> Ranks | None:
    """This process's ranks, read once: a SLURM/submitit task first gets torch's variables from the scheduler's
    (slurm.py), so that it reads as torchrun's would. None for a process nobody started as one of several. Private to
    session/: the rest of the package is handed them (detect() and worker_ranks(), framework/session/detect.py)."""
    scheduler = adopt_scheduler_ranks()
    found = read_ranks(os.environ)
    if found is not None and scheduler is not None:
        found = replace(found, scheduler=scheduler, submitit=started_by_submitit())
    return found


def restart_attempt() -> int:
    """0 for the first attempt; n after the elastic agent restarted the worker group n times."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_worker(local_workers: int) -> int:
    """CPU threads each local worker may use so that workers do not fight over cores."""
    return max(1, cpu_cores() // max(1, local_workers))


_LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


def take_local_rank_argument(argv: list[str]) -> list[str]:
    """argv without `--local_rank=N` / `--local-rank=N` (or `--local_rank N`), keeping N as LOCAL_RANK.

    torch.distributed.launch (without --use_env) and DeepSpeed's launcher append it for scripts that read it;
    Hydra would refuse it as an override before anything starts. Both launchers also set LOCAL_RANK, which wins.
    A value that is no local rank is a ConfigError."""
    kept, i = [], 0
    while i < len(argv):
        name, has_value, value = argv[i].partition("=")
        if name not in _LOCAL_RANK_FLAGS:
            kept.append(argv[i])
            i += 1
            continue
        if not has_value:
            value = argv[i + 1] if i + 1 < len(argv) else ""
            i += 1
        if not value.isdigit():
            raise ConfigError(f"{name}={value!r} is not allowed: expected a local rank (an integer >= 0), "
                              "as torch.distributed.launch and DeepSpeed's launcher pass it")
        os.environ.setdefault("LOCAL_RANK", value)
        i += 1
    return kept


@contextlib.contextmanager
def import_path_for_children():
    """Processes started inside this block import what this one imports: its sys.path goes first in PYTHONPATH.
    Workers must run the driver's code, and two starters would not give it to them: Python 3.11's forkserver (the
    worker template) is handed sys.path but preloads its modules with its own, and Horovod's runner starts fresh
    interpreters; both found an installed copy of the package (or none) when a checkout's train.py ran elsewhere."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + ([before] if before else []))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
