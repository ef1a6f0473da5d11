"""Start workers with Horovod's own runner (horovod.runner.run, the Python API behind horovodrun) on the
gloo controller, and bring rank 0's result back to the driver; import Horovod with one clear error when it cannot be
used, and broadcast rank 0's object under one name (the payload under horovodrun, and HorovodGroup's)."""
from __future__ import annotations

import contextlib
import importlib
import os
import re
import shutil
import signal
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable

from framework.common.errors import ConfigError
from framework.launch.elastic import WorkersFailed
from framework.session.detect import worker_ranks
from framework.session.environment import Ranks, import_path_for_children, threads_per_worker
from framework.training.interrupts import Interrupted

INSTALL = "bash scripts/setup.d/10-horovod.sh .venv (builds horovod 0.28.1 for this torch; see docs/engines/horovod.md)"

# horovod's runner must finish its checks (and, with remote hosts, start them over ssh) within this time.
START_TIMEOUT_S = 120
_SHUT_DOWN = "Horovod has been shut down"  # what every other rank's collective raises once one rank failed
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def import_horovod():
    """horovod.torch, or one clear error naming the install command (an optional engine: imported only by a horovod
    run's processes)."""
    try:
        return importlib.import_module("horovod.torch")
    except ImportError as exc:
        raise ConfigError(f"strategy=horovod is not allowed: horovod is not usable here ({exc}); install it with: "
                          f"{INSTALL}") from None


def broadcast_from_rank0(hvd, obj):
    # One explicit name: Horovod's default is the object's type name, and rank 0 sends a dict while the others
    # pass None, so the collectives would never match.
    return hvd.broadcast_object(obj, root_rank=0, name="hydra_dist.broadcast_object")


def run_worker(entry: Callable[[Any, Ranks], Any], payload: Any, error_dir: str) -> Any:
    """What horovod's runner executes in every worker: entry(payload, ranks) with the ranks the runner gave it, and
    its error written down for the driver (the runner itself only reports an exit code)."""
    ranks = worker_ranks()
    try:
        return entry(payload, ranks)
    except BaseException as exc:
        if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            with contextlib.suppress(OSError):
                Path(error_dir, f"rank{ranks.rank}").write_text(f"{type(exc).__name__}: {exc}")
        raise


def launch_horovod(entry: Callable[[Any, Ranks], Any], payload: Any, *, np: int, hosts: str | None,
                   local_workers: int) -> Any:
    from horovod.runner import run as horovod_run  # an optional engine, imported only when a horovod run starts

    error_dir = tempfile.mkdtemp(prefix="hydra-dist-horovod-")
    env_before = os.environ.get("OMP_NUM_THREADS")
    if env_before is None:
        # Workers inherit the driver's environment; without this each of N workers (CPU or GPU) uses every core.
        os.environ["OMP_NUM_THREADS"] = str(threads_per_worker(local_workers))
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    # horovod's runner installs its own SIGINT/SIGTERM handlers (they stop every worker) and leaves them
    # installed. A wakeup fd records which signal arrived whatever handler runs, so we can report it.
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    old_wakeup = signal.set_wakeup_fd(wake_w.fileno())
    try:
        with import_path_for_children():
            results = horovod_run(run_worker, args=(entry, payload, error_dir), num_proc=np,
                                  hosts=hosts or f"localhost:{np}", use_gloo=True, start_timeout=START_TIMEOUT_S)
    except RuntimeError as exc:
        signum = _signal_received(wake_r)
        if signum is not None:
            raise Interrupted(signum) from None
        raise WorkersFailed(_root_cause(error_dir, exc)) from exc
    else:
        # the runner can return as if every worker succeeded after it stopped them for a signal: its middleman reaps
        # the worker's shell from two threads and the loser reads exit code 0 (horovod's safe_shell_exec)
        signum = _signal_received(wake_r)
        if signum is not None:
            raise Interrupted(signum) from None
    finally:
        signal.set_wakeup_fd(old_wakeup)
        wake_r.close()
        wake_w.close()
        for s, handler in handlers.items():
            signal.signal(s, handler)
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        shutil.rmtree(error_dir, ignore_errors=True)
    return next((r for r in results if r is not None), None)


def _signal_received(wake_r: socket.socket) -> int | None:
    try:
        data = wake_r.recv(64)
    except BlockingIOError:
        return None
    signums = [b for b in data if b in _SIGNALS]
    return signums[0] if signums else None


def _root_cause(error_dir: str, exc: RuntimeError) -> str:
    """The first worker to fail (horovod's runner names it) and its Python error. A rank whose error only says that
    Horovod shut down (because another rank failed) is not the root cause: the rank whose error says more is."""
    errors = {p.name[4:]: p.read_text() for p in Path(error_dir).glob("rank*")}
    causes = {r: e for r, e in errors.items() if _SHUT_DOWN not in e}
    first = re.search(r"Process name: (\S+)\s+Exit code: (-?\d+)", str(exc))
    if first is None:
        return " ".join(str(exc).split())
    rank, code = first.group(1), int(first.group(2))
    if rank not in causes and causes:
        rank = min(causes, key=lambda r: int(r) if r.isdigit() else 0)
    if rank in errors:
        return f"worker rank {rank} failed: {errors[rank]}"
    how = "exited"
    if code > 128:  # the shell that runs the worker reports death by signal N as 128 + N
        with contextlib.suppress(ValueError):
            how = f"was killed by {signal.Signals(code - 128).name}"
    return (f"worker rank {rank} {how} (exit code {code}) without a Python error, and horovod's runner stopped "
            "the other workers; see the worker output above")
