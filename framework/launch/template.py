"""The workers' template: a fresh interpreter (multiprocessing's forkserver) that imports what every worker needs
once, and that each worker of torch's elastic agent (framework/launch/elastic.py) is forked from.

It takes about 4 s to import on 2 cores, so the driver starts it as early as it can: right after Hydra composed the
config, before the driver itself imports torch (framework/cli.py: train_app), where the config alone says that the
run's workers will fork from it (starts_workers_from_template). This module imports neither torch nor an engine."""
from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
from pathlib import Path

from omegaconf import DictConfig

from framework.config.strategy_options import MESH_TARGET
from framework.session.environment import import_path_for_children

# What every worker imports before its first step, imported once in the template process instead of in each worker:
# the worker's code (torch with it), and torch._dynamo, which torch imports at the first optimizer a process builds
# (about 2 s each on 2 cores).
WORKER_MODULES = ("framework.worker", "torch._dynamo")


def start_worker_template(extra_modules: tuple[str, ...] = ()) -> bool:
    """Start the process the workers are forked from (multiprocessing's forkserver), importing WORKER_MODULES (and
    an engine's own, e.g. deepspeed) there now, while the driver goes on with its checks. It is a fresh process with
    one thread (this one runs the rendezvous store's threads, which forked workers of a two-node job hung on), and
    holds the environment of this moment: what the agent sets per worker (ranks, OMP_NUM_THREADS,
    CUDA_VISIBLE_DEVICES) it sets in each worker again. Importing torch does not initialize CUDA, so GPU workers may
    fork from it. Idempotent (the modules of the first start are the template's). Not in a process of a pool (a joblib
    job: its pool's semaphores would leak): there the workers are spawned. Returns whether the workers will fork from
    the template."""
    if multiprocessing.parent_process() is not None:
        return False
    multiprocessing.set_forkserver_preload([*WORKER_MODULES, *extra_modules])
    with import_path_for_children():
        multiprocessing.forkserver.ensure_running()
    return True


def starts_workers_from_template(strategy: DictConfig) -> bool:
    """Whether the composed strategy node alone says its workers fork from the template with nothing of the engine's
    own preloaded: the mesh's presets (ddp, fsdp, hsdp, tp, pp). strategy=auto, an engine with modules of its own to
    preload (deepspeed) and a user's engine start it after the driver typed the config (Starter.warm_up)."""
    # auto composes as ddp's node, _target_ and all, and chooses single without GPUs: no template then
    return strategy.get("_target_") == MESH_TARGET and strategy.get("name") != "auto"


class EarlyTemplate:
    """The template started before the driver checked the run, with the engine's module the strategy node names
    (each worker imports it first: ~0.2-0.4 s less per worker after the launch); stopped with stop_worker_template."""

    def __init__(self, strategy: DictConfig) -> None:
        start_worker_template((str(strategy["_target_"]).rpartition(".")[0],))


def stop_worker_template() -> None:
    """The template this process started (EarlyTemplate's, or a starter's at warm_up: deepspeed, auto's ddp, a
    user's engine), stopped when the run ends, however it ends: after a refusal it would go on importing torch for
    seconds after the driver exited, and after the workers finished it would spend a second or more unloading torch,
    a process of the run left behind that holds the command's output open."""
    for pid in _children():
        if b"forkserver" not in _command_line(pid):
            continue
        try:
            os.kill(pid, signal.SIGKILL)  # it holds no file; the workers forked from it are the agent's
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _children() -> set[int]:
    """This process's child processes: those whose parent, in Linux's /proc/<pid>/stat, is this one (the kernel's
    per-task `children` lists may miss a child while it is being made); none where /proc cannot be read."""
    me, found = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rpartition(")")[2].split()[1]) == me:
                found.add(int(entry.name))
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            continue
    return found


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
