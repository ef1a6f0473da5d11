"""Parallel sweep jobs on one machine (hydra/launcher=joblib): each job gets its own share of the GPUs and
CPU cores, so two jobs never train on the same GPU or fight over the same cores.

joblib runs the jobs in a pool of n_jobs worker processes. Each worker process claims the lowest free slot
0..n_jobs-1 with an exclusive lock on a file in the sweep folder and keeps it for its lifetime (the lock goes
away with the process, so a restarted worker finds its slot free). Slot k gets GPUs [k*g, (k+1)*g) with
g = GPUs // n_jobs (CUDA_VISIBLE_DEVICES, set before CUDA starts in this process) and the k-th share of the
cores (CPU affinity, which ddp's workers inherit and divide among themselves).
Rendezvous ports need nothing here: every ddp launch already uses its own store on a free port."""
from __future__ import annotations

import ctypes
import fcntl
import multiprocessing
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


from framework.common.errors import ConfigError

SLOT_DIR = ".job_slots"
_claimed: list["JobSlot"] = []  # this process's slot, once claimed (a joblib worker process runs many jobs)


@dataclass(frozen=True)
class JobSlot:
    index: int
    of: int
    gpus: tuple[str, ...]  # as CUDA_VISIBLE_DEVICES names them (indices or UUIDs)
    cores: tuple[int, ...]

    def describe(self) -> str:
        gpus = f"CUDA_VISIBLE_DEVICES={','.join(self.gpus)}" if self.gpus else "no GPU"
        return f"parallel job slot {self.index + 1}/{self.of}: {gpus}, {len(self.cores)} CPU core(s)"


def parallel_jobs(n_jobs: int) -> int:
    """joblib's reading of n_jobs: -1 is every core, -2 every core but one, and so on."""
    import joblib  # the joblib launcher's own package, there whenever its jobs run

    return max(1, joblib.cpu_count() + 1 + n_jobs) if n_jobs < 0 else max(1, n_jobs)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them, counted without starting CUDA here (so that
    narrowing the list afterwards pins this process: count_gpus_elsewhere)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and not g.strip().startswith("-")]
    return [str(i) for i in range(count_gpus_elsewhere())]


def count_gpus_elsewhere() -> int:
    """torch.cuda.device_count(), asked in a child process. Here it would read NVML, but where NVML does not answer it
    asks the CUDA driver, which fixes this process's devices at that moment: CUDA_VISIBLE_DEVICES narrowed afterwards
    would not reach it, and every slot training in its own process (single, dp) would use GPU 0. No child where no
    GPU can be: a torch without CUDA, or no NVIDIA driver (whose libcuda the CUDA runtime loads)."""
    import torch  # here: the driver's front door (framework/cli.py) imports this module before torch

    if not torch.backends.cuda.is_built():
        return 0
    if torch.version.cuda:
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            return 0
    child = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           capture_output=True, text=True, check=True)
    return int(child.stdout.split()[-1])


def share(slot: int, slots: int, gpus: list[str], cores: list[int]) -> JobSlot:
    per_job = len(gpus) // slots
    if gpus and per_job == 0:
        raise ConfigError(
            f"hydra.launcher.n_jobs={slots} is not allowed with {len(gpus)} GPU(s): parallel jobs would share GPUs; "
            f"use hydra.launcher.n_jobs={len(gpus)} or fewer"
        )
    per_job_cores = max(1, len(cores) // slots)
    job_cores = cores[slot * per_job_cores:(slot + 1) * per_job_cores] or [cores[slot % len(cores)]]
    return JobSlot(slot, slots, tuple(gpus[slot * per_job:(slot + 1) * per_job]), tuple(job_cores))


def _lock_lowest_free(folder: Path, slots: int) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(slots):
        fd = os.open(folder / f"slot-{k}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())  # who holds it: interrupt_slot_holders
            return k  # the descriptor stays open: the slot is ours until this process exits
        except BlockingIOError:
            os.close(fd)
    raise RuntimeError(f"no free parallel job slot in {folder}: more than {slots} jobs run at once")


def claim_slot(sweep_dir: Path, n_jobs: int) -> JobSlot:
    """This worker process's slot; pins GPUs and cores the first time, the same slot afterwards."""
    if _claimed:
        return _claimed[0]
    slots = parallel_jobs(n_jobs)
    gpus, cores = visible_gpus(), sorted(os.sched_getaffinity(0))
    slot = share(_lock_lowest_free(sweep_dir / SLOT_DIR, slots), slots, gpus, cores)
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(slot.gpus)
    os.sched_setaffinity(0, slot.cores)
    # joblib set OMP_NUM_THREADS for in-process threads; ddp recomputes it per worker from the affinity.
    os.environ.pop("OMP_NUM_THREADS", None)
    import torch  # here: the driver's front door (framework/cli.py) imports this module before torch

    torch.set_num_threads(len(slot.cores))
    # loky names its own start method in this worker; processes spawned from here (ddp's workers) would be told
    # to use it and fail with "cannot find context for 'loky'".
    multiprocessing.set_start_method("spawn", force=True)
    _keep_worker_for_the_sweep()
    _claimed.append(slot)
    return slot


def _keep_worker_for_the_sweep() -> None:
    """loky replaces a worker whose memory grew 300 MB since its first task, taking that for a leak. A sweep's jobs
    differ in size (a job reported finished in 50 ms, then one that trains; LeNet, then ResNet), and a replaced
    worker costs its slot a fresh interpreter and every import (4 s here) while the slot stands idle. Each job's
    memory goes with its run. loky offers no setting for this; it reads this module constant after every task."""
    from joblib.externals.loky import process_executor  # the joblib launcher's own package, there when it runs

    if hasattr(process_executor, "_MAX_MEMORY_LEAK_SIZE"):
        process_executor._MAX_MEMORY_LEAK_SIZE = sys.maxsize


def slot_holders(sweep_dir: Path) -> list[int]:
    """The pids of the live processes holding a slot of this sweep (a slot stays locked while its process lives)."""
    holders = []
    for path in sorted((sweep_dir / SLOT_DIR).glob("slot-*.lock")):
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # got it: nobody holds this slot now
        except BlockingIOError:
            text = os.read(fd, 32).decode().strip()
            if text.isdigit():
                holders.append(int(text))
        finally:
            os.close(fd)
    return holders


def interrupt_slot_holders(sweep_dir: Path) -> None:
    """Ctrl-C for the jobs running in this sweep's slots, which the terminal's does not reach (each pool worker lives
    in a session of its own: pool_worker.py); each stops as on Ctrl-C, with a checkpoint of the
    step it was at."""
    for pid in slot_holders(sweep_dir):
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:  # ended meanwhile
            pass
