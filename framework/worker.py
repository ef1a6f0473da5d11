"""What every training process runs, whichever strategy started it: join, assemble the run from its settings
(framework/assemble.py: each component from its own options), resume, fit, report."""
from __future__ import annotations

import multiprocessing
import random
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from framework.assemble import (Task, build_callbacks, build_task, data_share, example_input, hparams_of,
                                model_record, parallelize, run_signature, test_batches)
from framework.callbacks.base import Callbacks
from framework.checkpoints.disk import CheckpointNotWritten
from framework.checkpoints.manager import choose_checkpoint
from framework.checkpoints.position import Position
from framework.config.settings import Payload, Settings
from framework.config.targets import allowing
from framework.data.loaders import BatchPipeline, build_train_loader
from framework.data.ranks_in_turn import RanksInTurn
from framework.data.streams import is_stream
from framework.session.exit import end_soon_after_a_stop_signal, exit_at_end_of_finished_worker
from framework.session.environment import Ranks, restart_attempt
from framework.results.run_result import RunResult, Stopped
from framework.strategies import build_strategy
from framework.strategies.base import Strategy
from framework.telemetry.meters import IntervalMeter
from framework.telemetry.per_gpu import count_flops, has_convolutions
from framework.telemetry.progress import Console
from framework.telemetry.stall import Heartbeat, dump_nccl_flight_recorder, nccl_flight_recorder, watch_for_stalls
from framework.training.allocator import keep_freed_memory
from framework.training.checkpointing import Checkpointer
from framework.training.engine import ProcessGroup, slot_sizes
from framework.training.instrument import gradient_traffic, per_gpu, timed_barrier, wait_clock
from framework.training.interrupts import NoStop
from framework.training.trainer import LoopData, LoopTelemetry, RunInfo, Trainer, TrainingStopped


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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
        result = _train(s, Path(payload.run_dir), payload.resume, strategy, group, stop or NoStop())
        finished = True
        return result
    except (TrainingStopped, CheckpointNotWritten) as exc:  # every rank stops here together: report it, and do
        finished = True  # not make the agent restart us into the same wall
        return Stopped(str(exc)) if group.is_main else None
    except KeyboardInterrupt:
        if multiprocessing.parent_process() is not None:  # a spawned worker: the driver reports Ctrl-C
            sys.exit(130)
        raise
    finally:
        group.leave(wait_for_peers=finished and own_process)
        if finished and own_process:
            exit_at_end_of_finished_worker()


def _train(s: Settings, run_dir: Path, resume, strategy: Strategy, group: ProcessGroup, stop) -> RunResult | None:
    t = s.trainer
    say = console(run_dir, group.is_main, t.progress_bar, t.log_all_ranks)
    callbacks = Callbacks(build_callbacks(s.callbacks, t.profile))
    wrapped = None
    try:
        seed_everything(t.seed)
        task = build_task(s, group.device, strategy.channels_last_refusal)
        data, micro_batch = task.data, t.batch_size // (group.dp_size * t.grad_accum)
        # before any wrapper: FLOPs are counted on the plain module (ZeRO-3 would partition its weights in place)
        flops = count_flops(task.model, example_input(data), micro_batch) if group.is_main else None
        wrapped = parallelize(s, strategy, group, task)
        telemetry = _telemetry(s, group, wrapped, task, micro_batch, flops, say)
        source = _train_source(s, task, group, micro_batch, say)
        loop_data = LoopData(source, micro_batch, test_batches(task, group, t.num_workers), task.step, task.loss,
                             task.metrics)
        checkpointer = Checkpointer(group, run_dir, t.checkpoint_every_n_steps, t.keep_checkpoints, t.batch_size,
                                    run_signature(s, data), say, timed_barrier(group, telemetry.clock))
        run = RunInfo(run_dir, say, hparams_of(s, strategy.name), model_record(s.model, data), stop, checkpointer,
                      callbacks)
        trainer = Trainer(t, s.lr_schedule, group=group, wrapped=wrapped, data=loop_data, telemetry=telemetry, run=run)
        start = Position()
        checkpoint = resume if restart_attempt() == 0 else checkpoint_after_restart(t.resume, run_dir, group, say)
        if checkpoint is not None:
            start = trainer.resume(checkpoint)
        say(f"training {s.model_name} on {s.dataset.display_name} with strategy={strategy.name}: "
            f"{group.world_size} process(es) on {group.device.type}, global batch {t.batch_size} = "
            f"{group.dp_size} x {micro_batch} per {'process' if group.dp_size == group.world_size else 'data-parallel rank'}"
            f" x {t.grad_accum} accumulation, {trainer.steps_planned()}")
        dump = (lambda: dump_nccl_flight_recorder(group.rank)) if strategy.trainer.cuda else None
        with watch_for_stalls(t.stall_timeout, telemetry.heartbeat, run_dir, group.rank, group.world_size, say,
                              checkpointer.last_saved, before_exit=dump):
            trainer.fit(start)
        return _result(s, strategy, group, trainer, checkpointer, start, micro_batch) if group.is_main else None
    finally:
        callbacks.close()
        if wrapped is not None:
            wrapped.close()
        say.close()


def _train_source(s: Settings, task: Task, group: ProcessGroup, micro_batch: int, say):
    """This process's training steps: its data-parallel rank's; with trainer.deal_as_ranks=N those of N ranks in
    turn (framework/data/ranks_in_turn.py; a stream one process reads is dealt so already)."""
    t, data = s.trainer, task.data
    pipeline = BatchPipeline(data.normalization, data.in_shape, group.device, task.channels_last, task.augment)
    share = data_share(group, micro_batch, t.grad_accum, t.num_workers)
    n = t.deal_as_ranks
    if n and not is_stream(data.train):
        played = [replace(share, rank=rank, world=n, grad_accum=t.grad_accum // n) for rank in range(n)]
        return RanksInTurn([build_train_loader(data, each, pipeline, s.dataset.in_memory, t.seed,
                                               say if each.rank == 0 else _unsaid) for each in played], share)
    return build_train_loader(data, share, pipeline, s.dataset.in_memory, t.seed, say)


def _unsaid(line: str) -> None:
    """The other played ranks' notes (trainer.deal_as_ranks): the first one's, said once."""


def _telemetry(s: Settings, group: ProcessGroup, wrapped, task: Task, micro_batch: int, flops,
               say) -> LoopTelemetry:
    """The loop's meters for what parallelize() made: its wait clock, per-slot meters, per-GPU facts, heartbeat."""
    t = s.trainer
    clock = wait_clock(wrapped, group)
    memory = [torch.device("cuda", i) for i in group.cuda_devices]
    meter = IntervalMeter(slot_sizes(wrapped, micro_batch), group.device, memory, clock,
                          share=group.dp_size / group.world_size,
                          traffic=gradient_traffic(wrapped, getattr(s.strategy, "compression", "none")))
    devices = per_gpu(group, wrapped, micro_batch, flops, t.precision, has_convolutions(task.model),
                      t.straggler_threshold, t.straggler_intervals, t.straggler_min_gap_ms, say)
    return LoopTelemetry(meter, devices, Heartbeat(group.device), clock)


def _result(s: Settings, strategy: Strategy, group: ProcessGroup, trainer: Trainer, checkpointer: Checkpointer,
            start: Position, micro_batch: int) -> RunResult:
    t, state = s.trainer, trainer.state
    totals = state.totals
    return RunResult(
        test_metrics=dict(totals.val_metrics), objective=t.objective, test_loss=totals.val_loss,
        train_loss=totals.train_loss, samples_per_sec=totals.samples / totals.seconds if totals.seconds else 0.0,
        per_rank_samples_per_sec=totals.per_slot_samples_per_sec(), per_rank_max_memory_gib=totals.slot_max_mem_gib,
        train_seconds=totals.seconds, steps=state.step, skipped_steps=totals.skipped_steps,
        epochs=state.epoch + 1 if state.stop_reason else state.epochs, processes=group.world_size,
        global_batch=t.batch_size, micro_batch=micro_batch, strategy=strategy.name, device=group.device.type,
        resumed_from_step=start.step, checkpoint=str(checkpointer.last_saved() or ""),
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
