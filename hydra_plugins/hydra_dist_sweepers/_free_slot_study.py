"""The resumable Optuna sweep (hydra_plugins/hydra_dist_sweepers/resumable_optuna.py says what it does).

It extends hydra-optuna-sweeper's OptunaSweeperImpl (pinned >=1.3,<1.4 in pyproject.toml): the plugin has no
public extension point, and reusing its search-space parsing (hydra.sweeper.params, command-line sweeps,
custom_search_space, the grid sampler) keeps every search space the plugin accepts working the same. Only the
loop that asks, launches and tells trials is new.

The study lives in the sweep folder as <sweep>/optuna_trials.jsonl (_trial_record.py), not in an
Optuna RDB storage: the plugin pins Optuna 2.x, whose RDB storage fails under SQLAlchemy 2 (what pip installs
today), so a SQLite study file would not open. Run again, the sweep adds the finished trials to a new study with
Optuna's own study.add_trial, so the sampler sees every earlier result."""

from __future__ import annotations

import functools
import math
import warnings
import logging
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import optuna
from hydra.core.utils import JobReturn
from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl, create_params_from_overrides
from omegaconf import OmegaConf
from optuna.trial import Trial, TrialState

from framework.session.slots import interrupt_slot_holders, parallel_jobs

from ._trial_record import TrialRecord, frozen_trial, is_finished

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialJob:
    number: int  # the job number: a stopped trial runs again under its own, so it finds its own job folder
    trial: Trial
    overrides: tuple[str, ...]


class FreeSlotStudy(OptunaSweeperImpl):
    def sweep(self, arguments: list[str]) -> None:
        space, fixed = self._search_space(arguments)
        directions = self._get_directions()
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        record = TrialRecord(sweep_dir)
        past = record.last_by_job()
        # Optuna 2.x calls add_trial, create_trial and enqueue_trial "experimental" (stable since 3.0)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        if past:  # a seeded sampler would draw the first run's parameters again for the new trials
            self.sampler.reseed_rng()
        study = optuna.create_study(study_name=self.study_name, storage=self.storage, sampler=self.sampler,
                                    directions=directions, load_if_exists=True)
        finished = [entry for entry in past.values() if is_finished(entry)]
        if self.storage is None:  # a new study in memory: give it what the sweep's earlier trials found
            for entry in finished:
                study.add_trial(frozen_trial(entry))
        stopped = [(number, entry) for number, entry in past.items() if not is_finished(entry)]
        new = max(0, self.n_trials - len(finished) - len(stopped))
        slots = self._slots()
        log.info(f"Optuna study in {record.path}: {len(finished)} trial(s) finished before, {len(stopped)} "
                 f"stopped (run again), {new} new; n_trials={self.n_trials}, {slots} at once")
        jobs = self._jobs(study, record, stopped, new, space, fixed, first_new=max(past, default=-1) + 1)
        outcome = _Outcome(study, record, directions, self.max_failure_rate, is_grid=self._is_grid)
        if slots == 1:
            self._one_at_a_time(jobs, outcome)
        else:
            self._side_by_side(jobs, outcome, slots)
        outcome.raise_if_too_many_failed()
        self._save_best(study, directions)

    def _search_space(self, arguments: list[str]) -> tuple[dict, dict]:
        """(distributions, fixed values), as hydra-optuna-sweeper reads them."""
        self._process_searchspace_config()
        space, fixed = create_params_from_overrides([*self._parse_sweeper_params_config(), *arguments])
        space = {**(self.search_space_distributions or {}), **space}
        self._is_grid = isinstance(self.sampler, functools.partial) and self.sampler.func == optuna.samplers.GridSampler
        if self._is_grid:
            grid = {name: self._to_grid_sampler_choices(d) for name, d in space.items()}
            self.sampler = self.sampler(grid)
            self.n_trials = min(self.n_trials, _grid_size(grid))
        return {k: v for k, v in space.items() if k not in fixed}, fixed

    def _slots(self) -> int:
        """Trials at once: n_jobs, where the launcher runs jobs elsewhere; one where it runs them in this process."""
        launcher = self.config.hydra.launcher
        target = str(launcher.get("_target_", ""))
        if target.endswith(".BasicLauncher"):
            if self.n_jobs > 1:
                print(f"note: hydra.sweeper.n_jobs={self.n_jobs}: Hydra's basic launcher runs one trial at a time; "
                      "hydra/launcher=joblib runs them side by side", flush=True)
            return 1
        if target.endswith(".JoblibLauncher"):  # more trials than joblib's workers would only wait in its queue
            return max(1, min(self.n_jobs, parallel_jobs(int(launcher.n_jobs))))
        return max(1, self.n_jobs)

    def _jobs(self, study: optuna.Study, record: TrialRecord, stopped: list[tuple[int, dict]], new: int,
              space: dict, fixed: dict, first_new: int) -> Iterator[TrialJob]:
        """Trials stopped last time first (their own parameters and job numbers), then new ones, each asked of the
        study only when a slot is free, so the sampler knows every result that came in before."""
        for number, entry in stopped:
            study.enqueue_trial(entry["params"])
            yield self._start(study, record, number, space, fixed)
        for number in range(first_new, first_new + new):
            yield self._start(study, record, number, space, fixed)

    def _start(self, study: optuna.Study, record: TrialRecord, number: int, space: dict, fixed: dict) -> TrialJob:
        trial = study.ask()
        [overrides] = self._configure_trials([trial], space, fixed)
        record.write(number, trial, TrialState.RUNNING)
        return TrialJob(number, trial, tuple(overrides))

    def _launch(self, job: TrialJob) -> JobReturn:
        [ret] = self.launcher.launch([list(job.overrides)], initial_job_idx=job.number)
        return ret

    def _one_at_a_time(self, jobs: Iterator[TrialJob], outcome: "_Outcome") -> None:
        # In this thread: the basic launcher runs the job here, and a job's Ctrl-C handling needs the main thread.
        for job in jobs:
            outcome.tell(job, self._launch(job))
            if outcome.too_many_failed():
                return

    def _side_by_side(self, jobs: Iterator[TrialJob], outcome: "_Outcome", slots: int) -> None:
        running: dict[Future, TrialJob] = {}
        with ThreadPoolExecutor(slots, thread_name_prefix="trial-slot") as pool:
            try:
                while True:
                    while len(running) < slots and not outcome.too_many_failed():
                        job = next(jobs, None)
                        if job is None:
                            break
                        running[pool.submit(self._launch, job)] = job
                    if not running:
                        return
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in finished:
                        outcome.tell(running.pop(future), future.result())
            except KeyboardInterrupt:
                # The running jobs stop as on Ctrl-C (a joblib worker in a process group of its own is told here),
                # each keeping a checkpoint of the step it was at; their trials stay RUNNING in the record, so the
                # sweep run again runs them again. Ctrl-C again leaves at once.
                interrupt_slot_holders(Path(str(self.config.hydra.sweep.dir)))
                log.info("Ctrl-C: waiting for the running trials to save their checkpoints (Ctrl-C again: leave now)")
                wait(running)
                raise

    def _save_best(self, study: optuna.Study, directions: list[str]) -> None:
        """optimization_results.yaml in the sweep folder, as hydra-optuna-sweeper writes it."""
        if not any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
            log.warning("no trial of the study completed: no optimization_results.yaml")
            return
        if len(directions) < 2:
            best = study.best_trial
            results = {"name": "optuna", "best_params": best.params, "best_value": best.value}
            log.info(f"Best parameters: {best.params}")
            log.info(f"Best value: {best.value}")
        else:
            results = {"name": "optuna", "solutions": [{"params": t.params, "values": t.values}
                                                        for t in study.best_trials]}
        OmegaConf.save(OmegaConf.create(results), Path(str(self.config.hydra.sweep.dir)) / "optimization_results.yaml")


def _grid_size(grid: dict[str, list]) -> int:
    size = 1
    for choices in grid.values():
        size *= len(choices)
    return size


class _Outcome:
    """Tells the study (and the sweep's record) each trial's result; counts failures against max_failure_rate."""

    def __init__(self, study: optuna.Study, record: TrialRecord, directions: list[str], max_failure_rate: float,
                 is_grid: bool):
        self.study, self.record, self.directions = study, record, directions
        self.max_failure_rate, self.is_grid = max_failure_rate, is_grid
        self.told = 0
        self.failed: list[JobReturn] = []

    def tell(self, job: TrialJob, ret: JobReturn) -> None:
        self.told += 1
        try:
            values = self._values(ret)
        except Exception as exc:  # the job failed, or returned no number: the trial fails, the study goes on
            log.warning(f"Failed trial (job {job.number}): {exc}")
            self.study.tell(job.trial, state=TrialState.FAIL)
            self.record.write(job.number, job.trial, TrialState.FAIL)
            self.failed.append(ret)
            return
        try:
            self.study.tell(job.trial, values=values)
        except RuntimeError as exc:  # the grid sampler stops the study once the grid is done; nothing to stop here
            if not (self.is_grid and "Study.stop" in str(exc)):
                raise
        self.record.write(job.number, job.trial, TrialState.COMPLETE, values)

    def _values(self, ret: JobReturn) -> list[float]:
        value: Any = ret.return_value  # raises the job's own exception when it failed
        values = [value] if len(self.directions) == 1 else list(value)
        if len(values) != len(self.directions):
            raise ValueError(f"the job returned {len(values)} value(s) for {len(self.directions)} direction(s)")
        values = [float(v) for v in values]
        if any(math.isnan(v) for v in values):
            raise ValueError("the job returned NaN")
        return values

    def too_many_failed(self) -> bool:
        return bool(self.failed) and len(self.failed) / self.told > self.max_failure_rate

    def raise_if_too_many_failed(self) -> None:
        if self.too_many_failed():
            log.error(f"{len(self.failed)} of {self.told} trials failed; hydra.sweeper.max_failure_rate="
                      f"{self.max_failure_rate}")
            for ret in self.failed:
                ret.return_value  # raises the first failure's exception, with its traceback
            # jobs that failed without an exception (hydra-dist's own refusals) end the sweep here; its summary
            # lists them and exits with an error
