"""Tasks that SLURM (srun, or submitit's sbatch script) or submitit_local started as the ranks of one job.

Such a task already is one rank: it must not start workers of its own. Here it gets torch's variables
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) from the scheduler's, so the rest
of the framework sees what torchrun would have left (environment.py reads them once): rank 0 drives, the other
ranks follow it."""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

from framework.common.errors import ConfigError

# Every task of a job computes the same port from the job id, without talking to the others (as submitit's
# TorchDistributedEnvironment does); different jobs, e.g. the jobs of an array on one node, get different ports.
# Below Linux's ephemeral range (32768-60999 by default), where any process's outgoing connection may hold a port: a
# task that found it taken connected to another program's server, or rank 0 could not bind (a suite run saw a hang).
_PORTS = (20000, 32767)
LOCAL_CONTROLLER = b"submitit.local._local"  # the module submitit_local runs per job, which starts its tasks


def _scheduler_job():
    """submitit's description of this task's job, or None when no scheduler started this process as a task."""
    in_submitit = started_by_submitit()
    # srun sets SLURM_STEP_NUM_TASKS for the tasks it starts; an sbatch script itself (which may hold
    # SLURM_NTASKS > 1 and SLURM_PROCID=0) is no rank and must start its own workers.
    in_srun_step = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1 and "SLURM_PROCID" in os.environ
    if not (in_submitit or in_srun_step):
        return None
    try:
        # the slurm extra, needed only in a scheduler's task
        import submitit
        from submitit.slurm.slurm import SlurmJobEnvironment  # (the same extra)
    except ImportError:
        if in_srun_step:
            raise ConfigError("this is one of several SLURM tasks, and mapping them to ranks needs submitit; "
                              "pip install 'hydra-dist[slurm]'") from None
        return None
    # Under a plain `srun python train.py` submitit did not start us, so read SLURM's variables directly.
    return submitit.JobEnvironment() if in_submitit else SlurmJobEnvironment()


def adopt_scheduler_ranks() -> str | None:
    """Export torch's rank variables from the scheduler's when this process is one task of several. Returns the
    scheduler ('slurm', or 'local' for submitit_local) when it did, else None (and nothing under torchrun, which
    set them itself). Called once per process, by environment._ranks()."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return None
    job = _scheduler_job()
    if job is None or job.num_tasks < 2:
        return None
    port = os.environ.get("MASTER_PORT") or str(random.Random(job.job_id).randint(*_PORTS))
    os.environ.update({
        "RANK": str(job.global_rank),
        "WORLD_SIZE": str(job.num_tasks),
        "LOCAL_RANK": str(job.local_rank),
        "LOCAL_WORLD_SIZE": str(job.num_tasks // job.num_nodes),
        "MASTER_ADDR": os.environ.get("MASTER_ADDR") or ("127.0.0.1" if job.cluster == "local" else job.hostnames[0]),
        "MASTER_PORT": port,
    })
    return job.cluster


def started_by_submitit() -> bool:
    """Started by submitit (its SLURM or local executor), which runs Hydra's job function in every task."""
    return bool(os.environ.get("SUBMITIT_EXECUTOR"))


def wait_for_local_jobs(timeout: float = 10.0) -> None:
    """A submitit_local sweep's driver, stopped by Ctrl-C: each job's controller (its child, which the terminal's
    SIGINT reached too) stops its tasks (SIGINT, then SIGKILL a second later) and exits; wait for that, so that
    nothing of the sweep outlives the command."""
    deadline = time.monotonic() + timeout
    while _local_controllers() and time.monotonic() < deadline:
        time.sleep(0.1)


def _local_controllers() -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == os.getpid() and LOCAL_CONTROLLER in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            pass  # gone meanwhile
    return found
