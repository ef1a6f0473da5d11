"""What every training process runs, whichever strategy started it: join, assemble the run from its settings
(framework/assemble.py: each component from its own options), resume, fit, report."""
from __future__ import annotations

import multiprocessing
import signal
import sys
from pathlib import Path

from framework.assemble import RunContext, assemble_run, build_callbacks
from framework.callbacks.base import Callbacks
from framework.checkpoints.disk import CheckpointNotWritten
from framework.checkpoints.manager import choose_checkpoint
from framework.checkpoints.position import Position
from framework.config.settings import Payload, Settings
from framework.config.targets import allowing
from framework.session.exit import after_a_peer_vanished, end_soon_after_a_stop_signal, exit_at_end_of_finished_worker
from framework.session.environment import Ranks, restart_attempt
from framework.results.run_result import RunResult, Stopped
from framework.strategies import build_strategy
from framework.strategies.base import Strategy
from framework.telemetry.progress import Console
from framework.telemetry.stall import StallSeat, dump_nccl_flight_recorder, nccl_flight_recorder, watch_for_stalls
from framework.training.allocator import keep_freed_memory
from framework.training.determinism import deterministic_environment
from framework.training.engine import ProcessGroup
from framework.training.interrupts import NoStop
from framework.training.trainer import Trainer, TrainingStopped


def worker_entry(payload: Payload, ranks: Ranks) -> RunResult | Stopped | None:
    """Entry of every worker a starter starts (torch's elastic agent, Horovod's runner run entry(payload, ranks)): the
    run's strategy, built here with the ranks the starter gave this worker, then its training (train_rank)."""
    s = payload.settings
    with allowing(s.targets):  # the `_target_`s the driver allowed this run to build
        strategy = build_strategy(s.strategy, s.trainer, ranks)
    return train_rank(payload, strategy)


def train_rank(payload: Payload, strategy: Strategy, stop=None) -> RunResult | Stopped | None:
    """One rank's training with the strategy its process built: a started worker's (worker_entry), the driver's own
    process (single, dp), or one of the ranks another program started (rank 0 and the others). `payload` holds the
    typed settings and the run folder: plain data, so nothing is composed or resolved again here. Returns rank 0's
    RunResult (or Stopped); other ranks return None."""
    keep_freed_memory()
    s = payload.settings
    deterministic_environment(s.trainer.deterministic)  # before join() starts CUDA in this process
    with allowing(s.targets):  # the `_target_`s the driver allowed this run to build
        return _worker(payload, s, strategy, stop)


def _worker(payload: Payload, s: Settings, strategy: Strategy, stop) -> RunResult | Stopped | None:
    own_process = not strategy.starter.runs_in_process
    if own_process:  # a process of its own, which its starter stops by signal
        end_soon_after_a_stop_signal()
        if strategy.trainer.cuda:
            nccl_flight_recorder(Path(payload.run_dir))  # read by the process group, created in join()
    group = strategy.join()
    finished = False
    try:
        run_dir = Path(payload.run_dir)
        t = s.trainer
        ctx = RunContext(settings=s, strategy=strategy, group=group, ranks=strategy.starter.ranks, run_dir=run_dir,
                         say=console(run_dir, group.is_main, t.progress_bar, t.log_all_ranks), stop=stop or NoStop())
        result = _train(ctx, payload.resume)
        finished = True
        return result
    except (TrainingStopped, CheckpointNotWritten) as exc:  # every rank stops here together: report it, and do
        finished = True  # not make the agent restart us into the same wall
        return Stopped(str(exc)) if group.is_main else None
    except KeyboardInterrupt as exc:
        if multiprocessing.parent_process() is not None:  # a spawned worker: the driver reports Ctrl-C (SIGTERM)
            sys.exit(128 + getattr(exc, "signum", signal.SIGINT))
        raise
    except Exception as exc:
        if own_process:  # the launcher names the rank that died, not this one
            after_a_peer_vanished(exc)
        raise
    finally:
        group.leave(wait_for_peers=finished and own_process)
        if finished and own_process:
            exit_at_end_of_finished_worker()


def _train(ctx: RunContext, resume) -> RunResult | None:
    s, strategy, group, say = ctx.settings, ctx.strategy, ctx.group, ctx.say
    t = s.trainer
    callbacks = Callbacks(build_callbacks(s.callbacks, t.profile))
    trainer = None
    try:
        trainer = assemble_run(ctx, callbacks)
        micro_batch, checkpointer = trainer.data.micro_batch, trainer.checkpointer
        start = Position()
        checkpoint = resume if restart_attempt() == 0 else checkpoint_after_restart(t.resume, ctx.run_dir, group, say)
        if checkpoint is not None:
            start = trainer.resume(checkpoint)
        say(f"training {s.model_name} on {s.dataset.display_name} with strategy={strategy.name}: "
            f"{group.world_size} process(es) on {group.device.type}, global batch {t.batch_size} = "
            f"{group.dp_size} x {micro_batch} per {'process' if group.dp_size == group.world_size else 'data-parallel rank'}"
            f" x {t.grad_accum} accumulation, {trainer.steps_planned()}")
        dump = (lambda: dump_nccl_flight_recorder(group.rank)) if strategy.trainer.cuda else None
        seat = StallSeat(ctx.run_dir, group.rank, group.world_size)
        with watch_for_stalls(t.stall_timeout, trainer.telemetry.heartbeat, seat, say, checkpointer.last_saved,
                              before_exit=dump):
            trainer.fit(start)
        return _result(ctx, trainer, start) if group.is_main else None
    finally:
        callbacks.close()
        if trainer is not None:
            trainer.wrapped.close()
        say.close()


def _result(ctx: RunContext, trainer: Trainer, start: Position) -> RunResult:
    t, state, group = ctx.settings.trainer, trainer.state, ctx.group
    totals = state.totals
    return RunResult(
        test_metrics=dict(totals.val_metrics), objective=t.objective, test_loss=totals.val_loss,
        train_loss=totals.train_loss, samples_per_sec=totals.samples_per_sec,
        per_rank_samples_per_sec=totals.per_slot_samples_per_sec(), per_rank_max_memory_gib=totals.slot_max_mem_gib,
        train_seconds=totals.seconds, steps=state.step, skipped_steps=totals.skipped_steps,
        epochs=state.epoch + 1 if state.stop_reason else state.epochs, processes=group.world_size,
        global_batch=t.batch_size, micro_batch=trainer.data.micro_batch, strategy=ctx.strategy.name,
        device=group.device.type, resumed_from_step=start.step, checkpoint=str(trainer.checkpointer.last_saved() or ""),
        objective_higher_is_better=state.higher_is_better,
        compression=trainer.telemetry.meter.traffic.label if trainer.telemetry.meter.traffic else "none",
        **totals.traffic(),
    )


def checkpoint_after_restart(resume: str | None, run_dir: Path, group: ProcessGroup, say):
    """After the elastic agent restarted the worker group: rank 0 picks (and verifies) the newest valid checkpoint
    of the run, and every rank resumes that one; no other rank reads the folder's files to check them again."""
    chosen = choose_checkpoint(resume, run_dir, warn=say) if group.is_main else None
    return group.broadcast_object(chosen)


def console(run_dir: Path, is_main: bool, progress_bar: bool, log_all_ranks: bool) -> Console:
    """Rank 0: a progress bar on a terminal (plain lines otherwise) and every line in the run folder's train.log.
    Other ranks: their own plain lines with trainer.log_all_ranks=true, else nothing."""
    if is_main:
        return Console(run_dir / "train.log", bar=progress_bar)
    return Console(bar=False, quiet=not log_all_ranks)
