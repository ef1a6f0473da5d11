"""How a strategy's training processes start (its starter): in the driver's own process, by torch's elastic agent
(ddp, fsdp, deepspeed, and a user's engine started like them), or by Horovod's runner. Where another program started
the ranks already (torchrun, SLURM, horovodrun: the session's Ranks, handed to every starter), `outer_kinds` says whose
ranks a starter's strategy can train with, and the counts are theirs."""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from framework.config.strategy_options import ElasticOptions, HorovodOptions
from framework.launch.elastic import launch_elastic, start_worker_template
from framework.launch.horovod_runner import launch_horovod
from framework.session.environment import HOROVOD, TORCH, Ranks, threads_per_worker

CPU_WORKERS_WITHOUT_GPU = 2


class Starter(ABC):
    runs_in_process = True  # launch() trains in the driver process (so the driver handles Ctrl-C for it)
    # kinds of outer ranks (framework.session.environment: TORCH, HOROVOD) whose already-started processes this
    # starter's strategy can train with; under any other, the driver refuses the strategy before training
    outer_kinds: frozenset[str] = frozenset()

    def __init__(self, ranks: Ranks | None):
        self.ranks = ranks  # the ranks another program started this process among (None: nobody did)

    @abstractmethod
    def processes(self) -> int:
        """Training processes in the whole job; the global batch is split across them."""

    @abstractmethod
    def describe(self) -> str:
        """What launch() would start on this machine, in one line (shown by `hydra-dist-devices`)."""

    @abstractmethod
    def launch(self, entry: Callable[[Any, Ranks | None], Any], payload: Any) -> Any:
        """Start the workers, run entry(payload, ranks) in each (ranks: that worker's, which its starter gave it),
        and return rank 0's result."""

    def warm_up(self) -> None:
        """The driver is about to check the run (a few seconds) before launch(): start what can start already."""


class InProcess(Starter):
    """This process is the only worker (single, dp)."""

    def __init__(self, description: str, ranks: Ranks | None):
        super().__init__(ranks)
        self.description = description

    def processes(self) -> int:
        return 1

    def describe(self) -> str:
        return self.description

    def launch(self, entry, payload):
        return entry(payload, self.ranks)


@dataclass(frozen=True)
class Preload:
    """What an engine's workers import once, in the worker template (its own modules: DeepSpeed's), and the variables
    those modules read when imported (DeepSpeed: DS_ACCELERATOR); the user's own settings win."""

    modules: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)


class Elastic(Starter):
    """One process per GPU (or CPU workers on gloo), started by torch's elastic agent, or by an outer torchrun /
    scheduler that already started them (`ranks`); they join a torch.distributed group (framework/strategies/
    groups.py)."""

    runs_in_process = False
    outer_kinds = frozenset({TORCH})

    def __init__(self, options: ElasticOptions, cuda: bool, backend: str, log_all_ranks: bool, ranks: Ranks | None,
                 note: str = "", preload: Preload = Preload()):
        super().__init__(ranks)
        self.options, self.cuda, self.backend, self.log_all_ranks = options, cuda, backend, log_all_ranks
        self.note = note  # the engine's own words after describe()'s
        self.preload = preload

    def nproc_per_node(self) -> int:
        if self.ranks is not None:
            return self.ranks.local_world_size
        if self.options.nproc_per_node is not None:
            return self.options.nproc_per_node
        return torch.cuda.device_count() if self.cuda else CPU_WORKERS_WITHOUT_GPU

    def processes(self) -> int:
        if self.ranks is not None:
            return self.ranks.world_size
        return self.options.nnodes * self.nproc_per_node()

    def describe(self) -> str:
        n = self.nproc_per_node()
        where = "GPUs, one per process" if self.cuda else (
            f"the CPU, {os.environ.get('OMP_NUM_THREADS', threads_per_worker(n))} thread(s) each")
        return (f"{self.processes()} process(es) ({self.options.nnodes} node(s) x {n}) on {where}, "
                f"backend {self.backend}, started by torch's elastic agent{self.note}")

    def launch(self, entry, payload):
        options = self.options
        if options.nproc_per_node is None and not self.cuda:
            _say_cpu_workers(options.name, "nproc_per_node")
        return launch_elastic(
            entry, payload, nproc_per_node=self.nproc_per_node(), nnodes=options.nnodes,
            rdzv_backend=options.rdzv_backend, rdzv_endpoint=options.rdzv_endpoint, node_rank=options.node_rank,
            max_restarts=options.max_restarts, run_id=options.run_id,
            log_all_ranks=self.log_all_ranks, log_dir=os.path.join(payload.run_dir, "worker_logs"),
            preload=self._preloaded())

    def warm_up(self) -> None:
        if self.ranks is None:
            start_worker_template(self._preloaded())

    def _preloaded(self) -> tuple[str, ...]:
        for name, value in self.preload.environment.items():
            os.environ.setdefault(name, value)
        return self.preload.modules


class Horovod(Starter):
    """Horovod's own runner (horovod.runner.run, gloo controller), or the workers horovodrun started."""

    runs_in_process = False
    outer_kinds = frozenset({HOROVOD})

    def __init__(self, options: HorovodOptions, cuda: bool, ranks: Ranks | None):
        super().__init__(ranks)
        self.options, self.cuda = options, cuda

    def under_horovodrun(self) -> bool:
        """horovodrun (or another Horovod launcher) started the workers, this process among them."""
        return self.ranks is not None and self.ranks.kind == HOROVOD

    def processes(self) -> int:
        if self.under_horovodrun():
            return self.ranks.world_size
        if self.options.np is not None:
            return self.options.np
        return torch.cuda.device_count() if self.cuda else CPU_WORKERS_WITHOUT_GPU

    def local_workers(self) -> int:
        if self.under_horovodrun():
            return self.ranks.local_world_size
        return self.processes() if self.options.hosts is None else max(self.options.host_slots().values())

    def describe(self) -> str:
        where = "GPUs, one per process" if self.cuda else "the CPU (gloo)"
        return f"{self.processes()} process(es) on {where}, started by Horovod's runner"

    def launch(self, entry, payload):
        if self.options.np is None and not self.cuda:
            _say_cpu_workers(self.options.name, "np")
        return launch_horovod(entry, payload, np=self.processes(), hosts=self.options.hosts,
                              local_workers=self.local_workers())


def _say_cpu_workers(name: str, option: str) -> None:
    print(f"strategy={name}: no GPU in use, so {CPU_WORKERS_WITHOUT_GPU} CPU workers on gloo "
          f"(set strategy.{option} to change)", flush=True)
