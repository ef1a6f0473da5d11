"""Start workers with torch's elastic agent: the machinery behind torchrun, called from Python."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from framework.checkpoints.disk import free_bytes
from framework.common.errors import ConfigError
from framework.launch.template import start_worker_template
from framework.training.interrupts import Interrupted
from framework.session.detect import worker_ranks
from framework.session.environment import Ranks, threads_per_worker
from framework.session.lifeline import end_with

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError


class WorkersFailed(RuntimeError):
    """A worker process exited with an error; the message carries the root cause."""


@dataclass(frozen=True)
class Rendezvous:
    """How the nodes' agents meet (torchrun's --nnodes, --rdzv-backend, --rdzv-endpoint, --node-rank, --rdzv-id) and
    how often they restart the worker group after a failure (--max-restarts)."""

    nnodes: int
    backend: str
    endpoint: str | None
    node_rank: int | None
    run_id: str | None
    max_restarts: int


def launch_elastic(entry: Callable[[Any, Ranks], Any], payload: Any, *, nproc_per_node: int, rendezvous: Rendezvous,
                   log_all_ranks: bool = False, log_dir: str | None = None, preload: tuple[str, ...] = ()) -> Any:
    """Run entry(payload, ranks) in nproc_per_node fresh processes per node (ranks: the ones the agent gave that
    worker); return global rank 0's result
    (None on nodes that do not hold rank 0). Local rank 0 keeps this console (a terminal stays a terminal,
    so rank 0 can draw its progress bar); the other ranks write to files under log_dir
    (<run_id>_*/attempt_<n>/<local rank>/stdout.log, stderr.log), and with log_all_ranks also to the
    console, each line prefixed [rank N]."""
    # torch's agent (~26 ms of CPU) here, not with this module: a run that starts no workers (single, dp) skips it
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # (the same)
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch  # (the same)

    if "OMP_NUM_THREADS" not in os.environ:
        # Without this, each of N workers (CPU or GPU: both run CPU ops, e.g. the optimizer of small tensors and
        # the data path) starts one thread per core and they thrash. torchrun sets 1; we share the cores out.
        os.environ["OMP_NUM_THREADS"] = str(threads_per_worker(nproc_per_node))
    nnodes, rdzv_backend, rdzv_endpoint = rendezvous.nnodes, rendezvous.backend, rendezvous.endpoint
    if nnodes == 1 and not rdzv_endpoint:
        # Like torchrun --standalone: a private store on a free port, so parallel jobs never collide.
        rdzv_backend, rdzv_endpoint = "c10d", "localhost:0"
    rdzv_configs: dict[str, Any] = {}
    if rdzv_backend == "static":
        rdzv_configs["rank"] = rendezvous.node_rank
    template = start_worker_template(preload)
    config = LaunchConfig(
        min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=nproc_per_node,
        run_id=rendezvous.run_id or uuid.uuid4().hex, rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint,
        rdzv_configs=rdzv_configs, max_restarts=rendezvous.max_restarts, monitor_interval=0.1,
        logs_specs=_rank_logs(nproc_per_node, log_all_ranks, log_dir),
        log_line_prefix_template="[rank${rank}]: " if log_all_ranks else None,
        # forked from the worker template (start_worker_template), not from this process
        start_method="forkserver" if template else "spawn",
    )
    try:
        with _quiet_agent():
            results = elastic_launch(config, _worker)(os.getpid(), entry, payload)
    except ChildFailedError as exc:
        raise WorkersFailed(_root_cause(exc)) from exc
    except SignalException as exc:  # the agent already stopped every worker (SIGTERM, then SIGKILL)
        raise Interrupted(exc.sigval) from None
    except json.JSONDecodeError as exc:  # a ValueError, but not the rendezvous': a failed worker's error file (in
        # log_dir, the run folder) could not be written or read back
        room = f" ({free_bytes(Path(log_dir)):,} bytes free there)" if log_dir else ""
        raise WorkersFailed(f"a worker failed, and its error report could not be read ({exc}); is the disk of "
                            f"{log_dir or 'its log folder'} full or read-only?{room}") from None
    except ValueError as exc:  # malformed endpoint and similar rendezvous problems
        raise ConfigError(f"strategy rendezvous settings are not usable: {exc}") from exc
    return next((r for r in results.values() if r is not None), None)


def _worker(driver: int, entry: Callable[[Any, Ranks], Any], payload: Any) -> Any:
    """What each worker runs: entry(payload, ranks) with the ranks the agent gave it, in a process that ends as soon
    as its driver does. The agent that would stop the workers runs in the driver, so a SIGKILLed driver would leave
    them training (framework/session/lifeline.py says why they watch the driver themselves)."""
    end_with(driver, _end_now)
    return entry(payload, worker_ranks())


def _end_now() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # nobody is left to report to; the last complete checkpoint stays


@contextlib.contextmanager
def _quiet_agent():
    """The agent logs a failed worker as a traceback of its own process-watching code (and spawn says it terminates
    the others): the driver reports the worker's root cause in one line instead (WorkersFailed)."""
    loggers = [logging.getLogger(name) for name in ("torch.distributed.elastic.multiprocessing.api",
                                                    "torch.multiprocessing.spawn")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _rank_logs(nproc_per_node: int, log_all_ranks: bool, log_dir: str | None) -> DefaultLogsSpecs:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std  # with the agent (launch_elastic)

    others = {local_rank: Std.ALL for local_rank in range(1, nproc_per_node)}
    if log_all_ranks:  # to a file and, through the agent, to the console with the line prefix
        return DefaultLogsSpecs(log_dir=log_dir, tee=others)
    return DefaultLogsSpecs(log_dir=log_dir, redirects=others)


def _root_cause(exc: ChildFailedError) -> str:
    rank, failure = exc.get_first_failure()
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", message)
    logs = os.path.dirname(failure.error_file) if failure.error_file else ""
    where = f" (its output: {logs})" if logs and os.path.isdir(logs) else ""
    return f"worker rank {rank} failed (exit code {failure.exitcode}){where}: {message}"
