"""The driver: runs once per job, in the process Hydra started. Types and validates the config, saves the resolved
config, starts the strategy's workers, and reports. Workers never run Hydra again.

How this process was started (a direct run, a sweep's job, a joblib pool's job, rank 0 or a follower of the ranks
torchrun, SLURM/submitit or horovodrun started) is its session (framework/session/): each situation says what it
claims, how it hands the run to the other ranks, how it fails and how it stops. Here is the run's story."""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from framework.assemble import build_callbacks
from framework.checkpoints.store import CHECKPOINT_DIR, newest_valid
from framework.common.errors import ConfigError
from framework.config.settings import Payload, refuse_dangling_interpolations, settings_of
from framework.config.targets import TargetAllowlist, allowing
from framework.launch.elastic import WorkersFailed
from framework.preflight import validate
from framework.results.failure_note import note_failure
from framework.results.provenance import record_start
from framework.results.result_file import format_rate, write_result
from framework.results.run_result import RunResult, Stopped
from framework.results.sweep_resume import RESOLVED_CONFIG, finished_before, objective_value
from framework.session.environment import Ranks
from framework.session.situations import Follower, Session
from framework.strategies import build_strategy, choose_strategy
from framework.telemetry.stall import mark_driver_process, stall_report
from framework.training.determinism import NoDeterministicKernel, callback_refusal
from framework.training.interrupts import GracefulStop, Interrupted, NoStop
from framework.worker import train_rank, worker_entry


def run(cfg: DictConfig, session: Session) -> float | None:
    """Hydra's job (framework/cli.py: train_app), in its session. Returns the test value of trainer.objective (a
    metric, or loss: what sweepers optimize); None for a failed job of a sweep, and on ranks > 0."""
    hydra_cfg = HydraConfig.get()
    if session.follows:  # submitit runs this function in every task of a job
        return train_as_follower(session)
    try:
        session.claim()
        if session.in_sweep and (done := finished_before(session.run_dir, cfg)) is not None:
            session.finished_before(f"its result.json says {done['objective']} {objective_value(done):.4f}")
            return objective_value(done)
        strategy, payload, note = plan_run(cfg, session.run_dir, session.ranks, warm_up=not session.leads)
        _record(cfg, strategy, session.run_dir, hydra_cfg, note)
        return _report(_train(strategy, payload, session), session)
    except (ConfigError, WorkersFailed) as exc:
        note_failure(session.run_dir, exc)  # the run folder's train.log keeps why (a sweep's summary shows it)
        return session.fail(exc)
    except KeyboardInterrupt:
        return session.stopped(signal.SIGINT, what_is_kept(session.run_dir))
    except Interrupted as exc:
        return session.stopped(exc.signum, what_is_kept(session.run_dir))


def train_as_follower(session: Follower) -> None:
    """A rank > 0: rank 0's payload, the same strategy built from it, and training as one rank; or rank 0's
    refusal, which ends this rank too; or nothing, when rank 0 found the sweep's job finished before."""
    message = session.hear()
    if "refusal" in message:
        return session.refused(message["refusal"])
    if "payload" in message:
        payload = message["payload"]
        with allowing(payload.settings.targets):  # the `_target_`s rank 0 allowed this run to build
            strategy = build_strategy(payload.settings.strategy, payload.settings.trainer, session.ranks)
        train_rank(payload, strategy, stop=NoStop())
    return None


def plan_run(cfg: DictConfig, run_dir: Path, outer: Ranks | None, warm_up: bool = False):
    """Choose the strategy (`outer`: the session's ranks, which torchrun & co. started and it must train with; None
    where nobody did), type the config and validate everything; no worker starts here (warm_up: the strategy's
    starter may start what it can while the checks run). Returns (strategy, payload, note)."""
    refuse_dangling_interpolations(cfg)
    with allowing(TargetAllowlist.of_command(cfg)):  # a training run trusts the config its user composed
        strategy_class, note = choose_strategy(cfg, outer)
        settings = settings_of(cfg, strategy_class.Options)
        strategy = strategy_class(settings.strategy, settings.trainer.engine(), ranks=outer)
        if warm_up:
            strategy.starter.warm_up()
        for name, callback in build_callbacks(settings.callbacks).items():
            refusal = callback.refuses(strategy.checkpoint_format.sharded)
            if refusal:
                raise ConfigError(f"callbacks.{name} is not allowed with strategy={strategy.name}: {refusal}")
            if refusal := callback_refusal(settings.trainer.deterministic, callback):
                raise ConfigError(f"callbacks.{name} {refusal}")
        resume = validate(settings, strategy, run_dir)
        if settings.trainer.check_fit and strategy.trainer.cuda:  # a CPU run plans nothing: it starts sooner
            from framework.plan.fit import check_fit  # the planner (every engine's rows) only where it plans
            from framework.plan.gpus import this_machines_gpu  # (the same)

            check_fit(cfg, strategy.starter.processes(), this_machines_gpu(), say=print)
    return strategy, Payload(settings, str(run_dir), resume), note


def _record(cfg: DictConfig, strategy, run_dir: Path, hydra_cfg, note: str) -> None:
    """The run folder's record of what runs: the resolved config, the engine's own settings, the provenance."""
    OmegaConf.save(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)), run_dir / RESOLVED_CONFIG)
    strategy.save_settings(run_dir)
    for line in (note, record_start(run_dir, hydra_cfg, sys.argv)):
        if line:
            print(line, flush=True)


def _train(strategy, payload: Payload, session: Session) -> RunResult | Stopped | None:
    """Train: as rank 0 of the ranks another program started (the others get the payload first), in this process
    (single, dp), or in the workers the strategy's starter starts. Returns rank 0's result."""
    mark_driver_process()
    launched_at = time.time()
    try:
        if session.leads:
            session.hand_off(payload)
            return train_rank(payload, strategy)
        if strategy.starter.runs_in_process:
            with GracefulStop() as stop:
                return strategy.starter.launch(lambda p, _ranks: train_rank(p, strategy, stop), payload)
        return strategy.starter.launch(worker_entry, payload)
    except WorkersFailed as exc:  # the workers ended a stall: say what rank 0 found (framework/telemetry/stall.py)
        raise WorkersFailed(stall_report(payload.run_dir, launched_at) or str(exc)) from None
    except NoDeterministicKernel as exc:  # raised in this process (single, dp, a rank another program started): one
        raise WorkersFailed(str(exc)) from None  # failure line, as a started worker's is


def _report(result: RunResult | Stopped | None, session: Session) -> float | None:
    run_dir, job = session.run_dir, session.job
    if result is None:  # a node that does not hold rank 0
        print(f"done: this node's workers finished; rank 0's node reports the result. Run folder {run_dir}", flush=True)
        return None
    if isinstance(result, Stopped):
        raise WorkersFailed(result.reason)
    result.run_dir, result.job, result.overrides = str(run_dir), job.number, list(job.overrides)
    write_result(run_dir, result.to_json())
    per_rank = ", ".join(format_rate(r) for r in result.per_rank_samples_per_sec)
    shown = "".join(f"test {'accuracy' if name == 'acc' else name} {value:.4f} | "
                    for name, value in result.test_metrics.items())
    compression = result.compression_line()
    print(
        f"done: {shown}{format_rate(result.samples_per_sec)} samples/s "
        f"(per rank: {per_rank}) | {compression + ' | ' if compression else ''}{result.train_seconds:.1f} s training | "
        f"run folder {run_dir}",
        flush=True,
    )
    return result.objective_value


def what_is_kept(run_dir: Path) -> str:
    """What a stopped run keeps: its last complete checkpoint."""
    checkpoint = newest_valid(run_dir / CHECKPOINT_DIR, warn=lambda m: None)
    return (f"the last complete checkpoint is {checkpoint.path} (step {checkpoint.step})" if checkpoint
            else "no checkpoint had been written yet, so a resumed run starts over")
