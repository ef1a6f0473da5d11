"""Facts about how this process was started, read from the environment a launcher leaves."""
from __future__ import annotations

import contextlib
import os
import sys

from framework.process.slurm import scheduler_name


# Kinds of outer launcher, by the variables they leave in each worker's environment.
TORCH = "torch"  # torchrun, torch.distributed.launch, DeepSpeed's `deepspeed`, SLURM/submitit tasks: RANK, WORLD_SIZE, ...
HOROVOD = "horovod"  # horovodrun: HOROVOD_RANK, HOROVOD_SIZE, ...
_HOROVOD_VARS = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")


def outer_launcher() -> str | None:
    """Which kind of launcher already started this process as one of many workers (TORCH or HOROVOD), or None. A
    SLURM/submitit task has torch's rank variables once its entry point adopted the scheduler's
    (framework/process/slurm.py: adopt_scheduler_ranks, called first by the commands and the Hydra job)."""
    if "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return TORCH
    if all(name in os.environ for name in _HOROVOD_VARS):
        return HOROVOD
    return None


def launcher_name() -> str:
    """The outer launcher as a user would name it, for messages."""
    scheduler = scheduler_name()
    if scheduler:
        return {"slurm": "SLURM tasks", "local": "submitit_local tasks"}.get(scheduler, scheduler)
    return "horovodrun" if outer_launcher() == HOROVOD else "torchrun"


def launched_externally() -> bool:
    """True when a launcher (torchrun and the like, SLURM, submitit, horovodrun) already started us as one of
    many workers."""
    return outer_launcher() is not None


def restart_attempt() -> int:
    """0 for the first attempt; n after the elastic agent restarted the worker group n times."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def env_rank() -> int:
    """This worker's global rank as its launcher set it (0 when no launcher did)."""
    return int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))


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
    Hydra would refuse it as an override before anything starts. Both launchers also set LOCAL_RANK, which wins."""
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
            raise SystemExit(f"error: {name}={value!r} is not allowed: expected a local rank (an integer >= 0), "
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
