"""The driver: runs once per job, in the process Hydra started. Types and validates the config, saves the resolved
config, hands the run to the strategy's launcher, and reports. Workers never run Hydra again.

When a launcher already started one process per rank (torchrun and the like, SLURM or submitit tasks, horovodrun),
rank 0 drives and trains, and the other ranks follow it (framework/launch/outer.py)."""
from __future__ import annotations

import shlex
import signal
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from framework.assemble import build_callbacks
from framework.checkpoints.store import CHECKPOINT_DIR, newest_valid
from framework.config.settings import Payload, settings_of
from framework.config.targets import TargetAllowlist, allowing
from framework.errors import ConfigError
from framework.launch.elastic import WorkersFailed
from framework.launch.job_slots import claim_slot
from framework.process.environment import env_rank, launched_externally, launcher_name
from framework.process.pool_worker import follow_the_driver
from framework.follower import follow
from framework.launch.outer import publish_to_followers, published
from framework.strategies import choose_strategy
from framework.process.slurm import adopt_scheduler_ranks, in_submitit_task, wait_for_local_jobs
from framework.preflight import validate
from framework.results.provenance import record_start
from framework.results.result_file import format_rate, write_result
from framework.results.run_result import RunResult, Stopped
from framework.results.sweep_resume import RESOLVED_CONFIG, finished_before, objective_value, resume_command
from framework.telemetry.stall import mark_driver_process, stall_report
from framework.worker import worker_entry
from framework.training.interrupts import GracefulStop, Interrupted


def run(cfg: DictConfig) -> float | None:
    """Hydra's task function. Returns the test value of trainer.objective (a metric, or loss: what sweepers
    optimize); None for a failed job of a sweep, and on ranks > 0."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if _in_job_pool(hydra_cfg):
        follow_the_driver()  # Ctrl-C and the driver's death stop this job through the driver (pool_worker.py)
    adopt_scheduler_ranks()  # submitit runs this function in every task of a job, without our command line
    external = launched_externally()
    if external and env_rank() != 0:  # a SLURM/submitit task runs this function on every rank
        follow()
        return None
    if external and hydra_cfg.mode == RunMode.MULTIRUN and not in_submitit_task():
        # rank 0 of `torchrun/srun train.py -m ...`: one job per rank cannot be a sweep
        print(f"error: {multirun_refusal()}", file=sys.stderr, flush=True)
        publish_to_followers(error=multirun_refusal())
        sys.exit(2)
    try:
        done = finished_before(run_dir, cfg) if hydra_cfg.mode == RunMode.MULTIRUN else None  # a sweep run again
        if done is not None:  # into its folder, where this job finished
            print(f"job {hydra_cfg.job.num} finished before in {run_dir}: not trained again; its result.json "
                  f"says {done['objective']} {objective_value(done):.4f}", flush=True)
            if external:  # submitit's other tasks of this job wait for rank 0's word
                publish_to_followers(finished=str(run_dir))
            return objective_value(done)
        _pin_parallel_job(hydra_cfg)
        return _drive(cfg, run_dir, hydra_cfg, external)
    except (ConfigError, WorkersFailed) as exc:
        if external and not published():  # e.g. a finished job of another config: the other tasks end with it
            publish_to_followers(error=str(exc))
        if hydra_cfg.mode == RunMode.MULTIRUN:  # let the other jobs run; the sweep summary lists this one as failed
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return None
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt:
        return _exit_interrupted(signal.SIGINT, run_dir, hydra_cfg)
    except Interrupted as exc:
        return _exit_interrupted(exc.signum, run_dir, hydra_cfg)


def multirun_refusal() -> str:
    return (f"-m/--multirun is not allowed under {launcher_name()}; run the sweep without it "
            "(for sweeps on SLURM: python train.py -m hydra/launcher=slurm ...)")


def _in_job_pool(hydra_cfg) -> bool:
    """A job of hydra/launcher=joblib: it runs in a worker process of the driver's pool."""
    return hydra_cfg.mode == RunMode.MULTIRUN and str(hydra_cfg.launcher.get("_target_", "")).endswith("JoblibLauncher")


def _pin_parallel_job(hydra_cfg) -> None:
    """Under hydra/launcher=joblib, jobs run side by side: give this one its own GPUs and cores."""
    if not _in_job_pool(hydra_cfg):
        return
    slot = claim_slot(Path(hydra_cfg.sweep.dir), int(hydra_cfg.launcher.n_jobs))
    print(slot.describe(), flush=True)


def prepare(cfg: DictConfig, external: bool, run_dir: Path, warm_up: bool = False):
    """Choose the strategy, type the config and validate everything; no worker starts here (warm_up: the launcher
    may start what it can while the checks run). Returns (strategy, payload, note)."""
    with allowing(TargetAllowlist.of_command(cfg)):  # a training run trusts the config its user composed
        strategy_class, note = choose_strategy(cfg, external)
        settings = settings_of(cfg, strategy_class.Options)
        strategy = strategy_class(settings.strategy, settings.trainer.engine())
        if warm_up:
            strategy.launcher.warm_up()
        for name, callback in build_callbacks(settings.callbacks).items():
            refusal = callback.refuses(strategy.checkpoint_format.sharded)
            if refusal:
                raise ConfigError(f"callbacks.{name} is not allowed with strategy={strategy.name}: {refusal}")
        resume = validate(settings, strategy, run_dir)
    return strategy, Payload(settings, str(run_dir), resume), note


def _drive(cfg: DictConfig, run_dir: Path, hydra_cfg, external: bool) -> float | None:
    try:
        strategy, payload, note = prepare(cfg, external, run_dir, warm_up=not external)
    except ConfigError as exc:
        if external:  # say it first: torchrun stops this process as soon as a follower exits
            print(f"error: {exc}", file=sys.stderr, flush=True)
            publish_to_followers(error=str(exc))
            if hydra_cfg.mode == RunMode.MULTIRUN:
                return None
            sys.exit(2)
        raise
    OmegaConf.save(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)), run_dir / RESOLVED_CONFIG)
    strategy.save_settings(run_dir)
    for line in (note, record_start(run_dir, hydra_cfg, sys.argv)):
        if line:
            print(line, flush=True)
    mark_driver_process()
    launched_at = time.time()
    try:
        if external:  # we are rank 0 of workers a launcher started: hand them the payload, then train here
            publish_to_followers(payload=payload)
            result = worker_entry(payload, strategy)
        elif strategy.launcher.runs_in_process:
            with GracefulStop() as stop:
                result = strategy.launcher.launch(lambda p: worker_entry(p, strategy, stop), payload)
        else:
            result = strategy.launcher.launch(worker_entry, payload)
    except WorkersFailed as exc:  # the workers ended a stall: say what rank 0 found (framework/telemetry/stall.py)
        raise WorkersFailed(stall_report(run_dir, launched_at) or str(exc)) from None
    if result is None:  # a node that does not hold rank 0
        print(f"done: this node's workers finished; rank 0's node reports the result. Run folder {run_dir}", flush=True)
        return None
    if isinstance(result, Stopped):
        raise WorkersFailed(result.reason)
    return _report(result, run_dir, hydra_cfg)


def _report(result: RunResult, run_dir: Path, hydra_cfg) -> float:
    result.run_dir, result.job, result.overrides = str(run_dir), hydra_cfg.job.get("num", 0), list(hydra_cfg.overrides.task)
    write_result(run_dir, result.to_json())
    per_rank = ", ".join(format_rate(r) for r in result.per_rank_samples_per_sec)
    shown = "".join(f"test {'accuracy' if name == 'acc' else name} {value:.4f} | "
                    for name, value in result.test_metrics.items())
    print(
        f"done: {shown}{format_rate(result.samples_per_sec)} samples/s "
        f"(per rank: {per_rank}) | {result.train_seconds:.1f} s training | run folder {run_dir}",
        flush=True,
    )
    return result.objective_value


def _exit_interrupted(signum: int, run_dir: Path, hydra_cfg) -> None:
    """Says what stopped and what is kept, then exits 128 + signum (a joblib pool's job returns instead)."""
    checkpoint = newest_valid(run_dir / CHECKPOINT_DIR, warn=lambda m: None)
    kept = (f"the last complete checkpoint is {checkpoint.path} (step {checkpoint.step})" if checkpoint
            else "no checkpoint had been written yet, so a resumed run starts over")
    stopped = f"\nstopped by {signal.Signals(signum).name}; all workers are stopped; {kept}."
    if _in_job_pool(hydra_cfg):
        # A pool worker's job, stopped by its driver (the resumable Optuna sweeper), which says the command once.
        # It returns: an exception out of one job makes joblib kill every worker, cutting the others' stops short.
        print(stopped, file=sys.stderr, flush=True)
        return None
    if hydra_cfg.mode == RunMode.MULTIRUN:  # finished jobs are reported, this one resumes, the rest run
        command = resume_command(Path(hydra_cfg.sweep.dir).absolute(), sys.argv)
    else:
        command = shlex.join(["python", "train.py", *_config_options(hydra_cfg), *_kept_overrides(hydra_cfg),
                              f"hydra.run.dir={run_dir}", "trainer.resume=auto"])
    print(f"{stopped}\nTo resume: {command}", file=sys.stderr, flush=True)
    sys.exit(128 + signum)


def exit_stopped_sweep(signum: int) -> None:
    """Ctrl-C reached the driver of a sweep whose jobs run in other processes (joblib's pool, submitit's tasks):
    its launcher stopped them, each keeping its last complete checkpoint. Says, once, the command that continues the
    sweep. Returns when no sweep runs (Ctrl-C while composing, a single run's driver)."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    wait_for_local_jobs()
    command = resume_command(Path(HydraConfig.get().sweep.dir).absolute(), sys.argv)
    print(f"\nstopped by {signal.Signals(signum).name}; the sweep's running jobs are stopped, each keeps its last "
          f"complete checkpoint.\nTo resume: {command}", file=sys.stderr, flush=True)
    sys.exit(128 + signum)


def _config_options(hydra_cfg) -> list[str]:
    """The run's own --config-dir and --config-name: without them a user's project would not compose again."""
    words = [w for source in hydra_cfg.runtime.config_sources
             if source.provider == "command-line" and source.schema == "file" for w in ("--config-dir", source.path)]
    if hydra_cfg.job.config_name != "config":
        words += ["--config-name", hydra_cfg.job.config_name]
    return words


def _kept_overrides(hydra_cfg) -> list[str]:
    return [o for o in hydra_cfg.overrides.task if not o.startswith(("hydra.run.dir=", "trainer.resume="))]
