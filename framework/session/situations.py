"""The situations a hydra-dist process can be in, one class each (detect.py says which). Each answers the same
questions, so the driver (framework/run.py) asks them without knowing how it was started:

    follows            a rank > 0 of ranks another program started: it takes rank 0's payload (hear()) and never
                       runs Hydra's job
    leads              rank 0 of such ranks: it hands the payload on (hand_off()) and trains as one rank itself
    in_sweep           its folder is a sweep's: a job that finished there before is reported (finished_before()),
                       not run again
    multirun           Hydra runs its job as one of a sweep's (-m), whether or not this situation can run one
    ranks              the Ranks another program started it among (None: nobody did), handed to the strategy
    claim()            what it takes before its job: a pool worker's own session and its share of GPUs and cores
    fail(exc)          one `error:` line; exit 2 for a refusal (a ConfigError), 1 for a failure while training; the
                       other ranks are told once; a sweep's job returns None instead (the sweep goes on, and its
                       summary lists the job as failed)
    stopped(sig, kept) what stopped it and what is kept, the command that resumes it; exit 128 + N (a pool's job
                       returns: its driver says the command)
    finish()           a command that ended well: a rank of several leaves at once (exit.py), any other returns

All of them are frozen: a process is what it was started as. A command that runs no job of a session (eval.py,
sample.py, verify.py, hydra-dist-devices) ends with refuse(exc) instead of fail(exc)."""
from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, NoReturn

from framework.common.errors import ConfigError
from framework.session.channel import hear_rank0, tell_followers, told_followers
from framework.session.environment import HOROVOD, Ranks
from framework.session.exit import exit_now
from framework.session.pool_worker import end_with_the_driver
from framework.session.resume import run_resume_command, sweep_resume_command
from framework.session.slots import claim_slot
from framework.session.slurm import wait_for_local_jobs

REFUSED, FAILED = 2, 1  # exit codes: a refusal before training (bad input), a failure while training
RANK0_END_WAIT_S = 30  # how long a rank > 0 refused by rank 0 under horovodrun waits for horovodrun to stop it


def exit_code(exc: BaseException) -> int:
    return REFUSED if isinstance(exc, ConfigError) else FAILED


def say_error(exc: BaseException | str) -> None:
    print(f"error: {exc}", file=sys.stderr, flush=True)


def refuse(exc: BaseException) -> NoReturn:
    """The end of a command that runs no job of a session (eval.py, sample.py, verify.py, hydra-dist-devices), or of
    any command before its session is known: one `error:` line, exit 2 for a refusal (a ConfigError), 1 for a
    failure. Nobody is told: no other rank waits for this process's word."""
    say_error(exc)
    sys.exit(exit_code(exc))


@dataclass(frozen=True)
class Job:
    """The Hydra job a process runs: its folder, and what it takes to run it again."""

    run_dir: Path
    number: int
    overrides: tuple[str, ...]  # the job's own overrides (hydra.overrides.task)
    config_options: tuple[str, ...]  # the command's --config-dir / --config-name, which compose it again
    argv: tuple[str, ...]  # the command line of this process
    sweep_dir: Path | None = None  # the sweep folder of a sweep's job


@dataclass(frozen=True)
class Session:
    """A process alone: nobody started it as one of several ranks, and it runs no sweep's job."""

    job: Job | None = None  # None before Hydra composed the job (the command's own start)
    ranks: Ranks | None = None  # where another program started this process as one of several ranks

    follows: ClassVar[bool] = False
    in_sweep: ClassVar[bool] = False

    @property
    def leads(self) -> bool:
        return self.ranks is not None and not self.follows

    @property
    def run_dir(self) -> Path:
        return self.job.run_dir

    @property
    def multirun(self) -> bool:
        """Hydra runs its job as one of a sweep's (-m/--multirun), wherever the sweep runs it (in_sweep: and its folder
        is the sweep's, so a job finished there before is reported)."""
        return self.job is not None and self.job.sweep_dir is not None

    def claim(self) -> None:
        """What this process takes for its job before anything else: nothing, unless it shares the machine."""

    def hand_off(self, payload) -> None:
        """Rank 0: the payload to the other ranks, which wait for it."""
        if self.leads:
            tell_followers(self.ranks, payload=payload)

    def finished_before(self, said: str) -> None:
        """A sweep's job that finished in its folder before: said; the other ranks, waiting for a payload, are told
        there is nothing to do."""
        print(f"job {self.job.number} finished before in {self.run_dir}: not trained again; {said}", flush=True)
        if self.leads:
            tell_followers(self.ranks, finished=str(self.run_dir))

    def fail(self, exc: BaseException) -> None:
        """The one way out of a refused or failed run: said first (torchrun stops every rank as soon as one exits),
        then the other ranks told if they still wait for rank 0, then the end (_end)."""
        say_error(exc)
        if self.leads and not told_followers():
            tell_followers(self.ranks, refusal=str(exc))
        return self._end(exit_code(exc))

    def _end(self, code: int) -> None:
        sys.exit(code)

    def stopped(self, signum: int, kept: str) -> None:
        """A signal ended the run: what stopped and what is kept (`kept`: the last complete checkpoint), the
        command that resumes it, exit 128 + signum."""
        print(f"\nstopped by {signal.Signals(signum).name}; all workers are stopped; {kept}.\n"
              f"To resume: {self.resume_command()}", file=sys.stderr, flush=True)
        sys.exit(128 + signum)

    def resume_command(self) -> str:
        return run_resume_command(self.job)

    def finish(self) -> None:
        """The command ended well."""
        if self.ranks is not None:  # what is left is the interpreter's teardown (exit.py)
            exit_now(0)


class Direct(Session):
    """`python train.py ...`: this process drives the run and starts its workers itself."""


class OuterRank0(Session):
    """Rank 0 of ranks torchrun (and the launchers like it), SLURM's srun or horovodrun started: it runs Hydra,
    checks the run, hands the payload to the other ranks and trains as one of them."""


class SweepUnderRanks(OuterRank0):
    """`torchrun ... train.py -m ...`: one job per rank cannot be a sweep; refused before anything runs."""

    def claim(self) -> None:
        raise ConfigError(f"-m/--multirun is not allowed under {self.ranks.started_by}; run the sweep without it "
                          "(for sweeps on SLURM: python train.py -m hydra/launcher=slurm ...)")


class SweepJob(Session):
    """A job of a sweep (`train.py -m`), run in the sweep's own process (Hydra's basic launcher) or in a task of its
    own (submitit): a failed job returns None, so the sweep goes on; a stopped one ends the sweep, and its command
    continues the sweep in its folder (finished jobs reported, this one resumed, the rest run)."""

    in_sweep = True

    def _end(self, code: int) -> None:
        return None

    def resume_command(self) -> str:
        return sweep_resume_command(self.job.sweep_dir, list(self.job.argv))


class SchedulerRank0(SweepJob):
    """Rank 0 of a sweep's job that submitit started as several tasks (SLURM, or submitit_local): a sweep's job
    that hands its payload to the other tasks."""


@dataclass(frozen=True)
class PoolJob(SweepJob):
    """A job of hydra/launcher=joblib, in a worker process of the driver's pool (loky), beside other jobs."""

    n_jobs: int = 1

    def claim(self) -> None:
        """A session of its own, ended with the driver (pool_worker.py), then its GPUs and cores (slots.py), for
        the worker's lifetime."""
        end_with_the_driver()
        print(claim_slot(self.job.sweep_dir, self.n_jobs).describe(), flush=True)

    def stopped(self, signum: int, kept: str) -> None:
        """Stopped by its driver (the resumable Optuna sweeper), which says the resume command once. It returns: an
        exception out of one job makes joblib kill every worker, cutting the others' stops short."""
        print(f"\nstopped by {signal.Signals(signum).name}; all workers are stopped; {kept}.", file=sys.stderr,
              flush=True)
        return None


@dataclass(frozen=True)
class Follower(Session):
    """A rank > 0 of ranks another program started: it never runs Hydra nor composes anything (one run folder, and
    a user's --config-dir needs no second reading); it takes rank 0's payload and trains as one rank. Rank 0's
    refusal ends it too: said by rank 0, and again here only where each task has a log of its own (SLURM,
    submitit)."""

    in_sweep_task: bool = False  # submitit runs Hydra's job function in every task of a sweep's job

    follows = True

    @property
    def multirun(self) -> bool:
        return self.in_sweep_task

    def hear(self) -> dict:
        """Rank 0's message (waiting for it): {"payload": ...}, {"refusal": ...} or {"finished": <run folder>}."""
        return hear_rank0(self.ranks)

    def fail(self, exc: BaseException) -> None:
        if self.ranks.scheduler:
            say_error(exc)
        return self._end(exit_code(exc))

    def refused(self, refusal: str) -> None:
        """Rank 0's refusal, which rank 0 said and is ending with. Under horovodrun this rank waits to be stopped:
        horovodrun stops every rank as soon as one exits non-zero and stops relaying their output then, so a rank
        > 0 that ended first cut rank 0's message off mid-line."""
        if self.ranks.kind == HOROVOD and not self.ranks.scheduler:
            time.sleep(RANK0_END_WAIT_S)  # horovodrun's SIGTERM ends it once rank 0 exited
        return self.fail(ConfigError(refusal))

    def _end(self, code: int) -> None:
        if self.in_sweep_task:  # rank 0's task reports the job to the sweep
            return None
        exit_now(code)

    def stopped(self, signum: int, kept: str = "") -> None:
        """Ctrl-C reached every rank: rank 0 says what stopped and what is kept."""
        exit_now(128 + signum)


@dataclass(frozen=True)
class SweepDriver:
    """The process that runs a sweep whose jobs run in other processes (joblib's pool, submitit's tasks), once Ctrl-C
    reached it: its launcher stopped them, each keeping its last complete checkpoint."""

    sweep_dir: Path
    argv: tuple[str, ...]

    def stopped(self, signum: int) -> None:
        """Says, once, the command that continues the sweep; exit 128 + signum."""
        wait_for_local_jobs()
        print(f"\nstopped by {signal.Signals(signum).name}; the sweep's running jobs are stopped, each keeps its last "
              f"complete checkpoint.\nTo resume: {sweep_resume_command(self.sweep_dir, list(self.argv))}",
              file=sys.stderr, flush=True)
        sys.exit(128 + signum)
