"""Which situation this process is in (situations.py): the only reader of Hydra's run mode and launcher, and
(through environment._ranks(), read once) of the variables torchrun, SLURM/submitit, horovodrun and hydra-dist's own
starters leave. A command asks detect() once, a worker its starter started worker_ranks(); everything else is handed
the Ranks they return (strategies, starters, groups)."""
from __future__ import annotations

import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from framework.session.environment import Ranks, _ranks
from framework.session.situations import (Direct, Follower, Job, OuterRank0, PoolJob, SchedulerRank0, Session,
                                          SweepDriver, SweepJob, SweepUnderRanks)

_JOBLIB = "JoblibLauncher"  # hydra/launcher=joblib: its jobs run in the worker processes of a pool


def detect(hydra_cfg=None) -> Session:
    """This process's situation: for Hydra's job (hydra_cfg: HydraConfig.get() inside it), or for the command before
    Hydra composed anything (hydra_cfg None)."""
    return situation(hydra_cfg, _ranks())


def worker_ranks() -> Ranks:
    """A worker that one of hydra-dist's starters started (torch's elastic agent, Horovod's runner): the ranks that
    starter left in its environment, read once."""
    found = _ranks()
    if found is None:
        raise RuntimeError("this process runs as a worker, but its starter left no ranks in its environment (RANK, "
                           "LOCAL_RANK, WORLD_SIZE or HOROVOD_RANK, ...)")
    return found


def situation(hydra_cfg, outer: Ranks | None) -> Session:
    """The situation of a process with this Hydra config (None: before composing) and these ranks (None: nobody
    started it as one of several)."""
    multirun = hydra_cfg is not None and hydra_cfg.mode == RunMode.MULTIRUN
    if outer is not None and outer.rank != 0:
        return Follower(ranks=outer, in_sweep_task=multirun)
    job = job_of(hydra_cfg) if hydra_cfg is not None else None
    if outer is not None:
        if not multirun:
            return OuterRank0(job, outer)
        return SchedulerRank0(job, outer) if outer.submitit else SweepUnderRanks(job, outer)
    if not multirun:
        return Direct(job)
    launcher = str(hydra_cfg.launcher.get("_target_", ""))
    if launcher.endswith(_JOBLIB):
        return PoolJob(job, n_jobs=int(hydra_cfg.launcher.n_jobs))
    return SweepJob(job)


def job_of(hydra_cfg) -> Job:
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    return Job(run_dir=Path(hydra_cfg.runtime.output_dir), number=int(hydra_cfg.job.get("num", 0) or 0),
               overrides=tuple(hydra_cfg.overrides.task), config_options=tuple(_config_options(hydra_cfg)),
               argv=tuple(sys.argv), sweep_dir=Path(hydra_cfg.sweep.dir).absolute() if multirun else None)


def _config_options(hydra_cfg) -> list[str]:
    """The run's own --config-dir and --config-name: without them a user's project would not compose again."""
    words = [w for source in hydra_cfg.runtime.config_sources
             if source.provider == "command-line" and source.schema == "file" for w in ("--config-dir", source.path)]
    if hydra_cfg.job.config_name != "config":
        words += ["--config-name", hydra_cfg.job.config_name]
    return words


def sweep_driver() -> SweepDriver | None:
    """The driver of the sweep this process runs, once Hydra started one; None when it runs none (Ctrl-C while
    composing, a single run's driver)."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return SweepDriver(Path(HydraConfig.get().sweep.dir).absolute(), tuple(sys.argv))
