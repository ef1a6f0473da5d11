"""The one training loop, shared by every strategy. What an engine does differently is behind the process group and
what its parallelize() returned (framework/training/engine.py); what watches the loop (console, TensorBoard, the best
weights, a user's own) is a callback; the meters, clocks and heartbeat are its telemetry (LoopTelemetry)."""
from __future__ import annotations

import itertools
import math
import time
from contextlib import ExitStack
from dataclasses import KW_ONLY, asdict, dataclass

import torch

from framework.checkpoints.position import Position, resume_point
from framework.common.errors import TrainingStopped
from framework.config.trainer import TrainerConfig
from framework.data.source import Filler, StepShare, StepSource
from framework.telemetry.meter import StepRecord
from framework.telemetry.meters import FRAME, IntervalMeter, IntervalSummary
from framework.telemetry.per_gpu import PerGpu
from framework.telemetry.stall import Heartbeat
from framework.training.loop_state import EvalResult, LoopState, RunInfo, RunTotals
from framework.training.determinism import raise_explained
from framework.training.engine import ProcessGroup, Weighting, Wrapped, forward_backward, gradient_sync
from framework.training.interrupts import Interrupted
from framework.training.lr_schedule import build_lr_schedule
from framework.training.skips import SkipStreak
from framework.training.metrics import EvalMetrics, higher_is_better, per_sample_losses


@dataclass
class LoopData:
    """The batches the loop trains and evaluates on, and how it scores them."""

    train: StepSource | None  # framework/data/source.py (None: eval.py, which only evaluates)
    micro_batch: int
    eval_batches: object  # a function returning this rank's test batches
    step: object  # framework/training/step.py: step(model, batch, loss) -> StepOutput
    loss: object  # loss(outputs, targets) -> per-sample losses (or per element of a sample), or their mean
    metrics: dict  # name -> a torchmetrics.Metric, or metric(outputs, targets) -> the batch's sum of a per-sample score
    _: KW_ONLY
    # trainer.invariant: how a step's micro-batch runs as micro-shards (framework/training/invariant/step.py)
    invariant: object = None


@dataclass
class LoopTelemetry:
    """The loop's meters: per-slot throughput and loss (kept on the device between log boundaries), what tells the
    GPUs apart at a boundary, where the loop is (for the stall watchdog) and the engine's wait clock."""

    meter: IntervalMeter
    per_gpu: PerGpu
    heartbeat: Heartbeat
    clock: object = None  # framework/training/instrument.py: wait_clock()
    data_seconds: float = 0.0  # fetching the step's data, until its StepRecord takes it

    def take_data_seconds(self) -> float:
        seconds, self.data_seconds = self.data_seconds, 0.0
        return seconds

    def batches(self, batches, step: int):
        """The micro-batches of one step, their fetch time metered (the data share of a step)."""
        while True:
            self.heartbeat.beat(step, "data")
            start = time.perf_counter()
            batch = next(batches)
            self.data_seconds += time.perf_counter() - start
            self.heartbeat.beat(step, "compute", batch)
            yield batch

    def share(self, shares, step: int):
        """The next step's share (framework/data/source.py: StepShare), or None; its fetch time metered (a stream's
        micro-batches are fetched, and its ranks agree, here)."""
        self.heartbeat.beat(step, "data")
        start = time.perf_counter()
        share = next(shares, None)
        self.data_seconds += time.perf_counter() - start
        return share

    def backward_done(self) -> None:
        """The last micro-batch's backward returned: an engine that reduces inside it has released this rank."""
        if self.clock is not None and self.clock.ends_with_backward:
            self.clock.stop()


def planned_steps(steps_per_epoch: int | None, epochs: int, max_steps: int) -> tuple[int | None, int]:
    """A run's optimizer steps (None: nothing bounds them) and epochs: trainer.epochs over a split of known length,
    cut by trainer.max_steps (0: none); over a stream, whose length is unknown, only trainer.max_steps counts steps."""
    if steps_per_epoch is None:
        return max_steps or None, epochs
    planned = epochs * steps_per_epoch
    total = min(max_steps, planned) if max_steps else planned
    return total, math.ceil(total / steps_per_epoch)


class Trainer:
    def __init__(self, options: TrainerConfig, lr_schedule, *, group: ProcessGroup, wrapped: Wrapped, data: LoopData,
                 telemetry: LoopTelemetry, run: RunInfo):
        self.options, self.group, self.wrapped, self.data = options, group, wrapped, data
        self.checkpointer, self.callbacks, self.telemetry, self.run = run.checkpointer, run.callbacks, telemetry, run
        self.say = run.say
        self.steps_per_epoch = data.train.steps_per_epoch
        if self.steps_per_epoch is not None and self.steps_per_epoch < 1:
            raise ValueError("the training split is smaller than one global batch")
        self.total_steps, self.epochs = planned_steps(self.steps_per_epoch, options.epochs, options.max_steps)
        objective = options.objective
        # what every callback gets (framework/training/loop_state.py); the loop moves its step, epoch and totals on
        self.state = LoopState(options, group, wrapped, run, self.total_steps, self.epochs,
                               higher_is_better=objective != "loss" and higher_is_better(data.metrics[objective]))
        # a run without a total (a stream without trainer.max_steps): the built-in schedules need one (the driver
        # said so)
        self.lr_schedule = build_lr_schedule(lr_schedule, wrapped.optimizer, self.total_steps,
                                             self.state.higher_is_better)
        self.skips = SkipStreak(options.max_consecutive_skips)
        caveat = getattr(telemetry.clock, "caveat", None)
        if caveat and len(telemetry.meter.slot_sizes) > 1 and group.is_main:
            self.say(f"note: {caveat}")

    def steps_planned(self) -> str:
        if self.steps_per_epoch is not None:
            return f"{self.total_steps} steps"
        passes = f"{self.epochs} pass(es) over the stream"
        return f"{passes}, at most {self.total_steps} steps" if self.total_steps else passes

    # ---- the loop ----------------------------------------------------------------------------
    def resume(self, checkpoint) -> Position:
        """Every rank: model, optimizer, totals and the callbacks' states from a checkpoint; its position."""
        position, totals, callbacks, lr_schedule = self.checkpointer.resume(checkpoint, self.wrapped)
        if totals:
            self.state.totals = RunTotals(**totals)
        self.lr_schedule.load_state_dict(lr_schedule)
        self.callbacks.load_state_dict(callbacks)
        return position

    def fit(self, start: Position = Position()) -> RunTotals:
        """Train from `start` (framework/checkpoints/position.py: why the data position is counted in samples, and
        how a run on another world size or batch continues the epoch without a sample twice or skipped)."""
        try:
            self.callbacks.on_fit_start(self.state)
            self._fit(start)
            self.checkpointer.finish()  # the checkpoint written behind the loop (trainer.async_checkpoint) committed
            self._checkpoints_committed()
            self.callbacks.on_fit_end(self.state)
        except BaseException as exc:
            left = self.checkpointer.abandon()  # a stop or an error waits for the write in flight, too
            if left:
                self.say(left)
            self.callbacks.on_exception(self.state, exc)
            raise_explained(exc, self.options.deterministic)
        return self.state.totals

    def _fit(self, start: Position) -> None:
        batch, meter, state, source = self.options.batch_size, self.telemetry.meter, self.state, self.data.train
        resumed = resume_point(start, batch, self.steps_per_epoch)
        step = state.step = resumed.step
        state.epoch = resumed.epoch
        evaluated_at = None  # the step of the last evaluation: an epoch end on a step evaluation's step adds none
        if step and self._evaluation_step(step):  # resumed from the checkpoint written just before that evaluation
            self._evaluate(step)
            evaluated_at = step
            if state.stop_reason:
                self.say(f"stopped at step {step}: {state.stop_reason}")
                return
        source.restore(start)
        meter.reset()  # the time since __init__ (a checkpoint being loaded) is not training time
        for epoch in range(resumed.epoch, self.epochs):
            state.epoch = epoch
            first = resumed.steps_in_epoch if epoch == resumed.epoch else 0
            last = None if self.total_steps is None else first + self.total_steps - step
            if self.steps_per_epoch is not None:
                last = min(self.steps_per_epoch, last)
            self.wrapped.model.train()
            shares, share = source.shares(epoch, first), None
            for _ in itertools.count() if last is None else range(first, last):
                share = self.telemetry.share(shares, step + 1)
                if share is None:  # the epoch had no step left (resumed at its end)
                    break
                step += 1
                state.step = step
                self.callbacks.on_train_step_start(state, step)
                self._train_step(share, step)
                self.callbacks.on_train_step_end(state, step)
                epoch_end = share.last or step == self.total_steps
                stopping = self.run.stop.requested  # read once: a signal may land anywhere below
                evaluating = self._evaluation_step(step)
                state.checkpoint_due = self.checkpointer.due(step, epoch_end, wanted=stopping or evaluating)
                if step % self.options.log_every_n_steps == 0 or state.checkpoint_due or evaluating:
                    self._log(step)
                if state.checkpoint_due:
                    self.telemetry.heartbeat.beat(step, "checkpoint")
                    at = source.state()
                    position = Position(step, epoch, at.samples, batch, at.records)
                    self.checkpointer.save(self.wrapped, position, asdict(state.totals), self.callbacks.state_dict(),
                                           self.lr_schedule.state_dict())
                    self._checkpoints_committed()
                if stopping:
                    raise Interrupted(self.run.stop.signum)
                if evaluating:
                    self._evaluate(step)
                    self._checkpoints_committed()  # the best checkpoint's keeping waits for the one of this step
                    evaluated_at = step
                    meter.reset()  # evaluation time is not training time
                    self.wrapped.model.train()
                    if state.stop_reason:
                        break
            state.checkpoint_due = False
            if share is not None and share.last:
                next(shares, None)  # a source ends its epoch when asked past the last step (a stream says what it gave)
            if meter.steps:
                self._log(step)
            epoch_evaluation = (epoch + 1) % self.options.eval_every_n_epochs == 0 or epoch == self.epochs - 1
            if epoch_evaluation and evaluated_at != step:
                self._evaluate(step)
            meter.reset()  # evaluation time is not training time
            if state.stop_reason:
                self.say(f"stopped after epoch {epoch + 1}, step {step}: {state.stop_reason}")
                break
            if step == self.total_steps:  # trainer.max_steps came before the epochs did
                break

    def _checkpoints_committed(self) -> None:
        """on_checkpoint_saved for each checkpoint committed since the last call: at its save, or (written behind
        the loop) at the next save, the best checkpoint's keeping or the end of the run."""
        for step, path in self.checkpointer.committed():
            self.callbacks.on_checkpoint_saved(self.state, step, path)

    def _evaluation_step(self, step: int) -> bool:
        """trainer.eval_every_n_steps: the clock is the global step, the same on every rank and across a resume."""
        every = self.options.eval_every_n_steps
        return bool(every) and step % every == 0

    def _train_step(self, share: StepShare, step: int) -> None:
        w = self.wrapped
        # Gradients are dropped here, while the forward pass is about to allocate: dropping them right after
        # optimizer.step() left the heap top free, glibc returned it to the OS and every step paid for page
        # faults again (zero_grad took 2.7 ms instead of 0.1 ms, 15% of a LeNet step on CPU).
        w.optimizer.zero_grad(set_to_none=True)
        if self.data.invariant is not None:  # the step's one micro-batch, run as its micro-shards
            batch = next(self.telemetry.batches(share.batches, step))
            ran = self.data.invariant.run(w, self.data, batch, step, self.state.epoch)
            losses, tokens, global_loss = ran.per_shard, ran.tokens, ran.global_sum
        else:
            (losses, tokens), global_loss = self._accumulate(share, step), None
        self.telemetry.backward_done()
        self.lr_schedule.apply(w.optimizer, step)
        stepped = w.precision.optimizer_step(w.model, w.optimizer, self.options.grad_clip,
                                             self.options.on_nonfinite == "skip")
        self._step_done(step, losses if stepped else [], tokens if stepped else [], stepped,
                        global_loss if stepped else None)

    def _accumulate(self, share: StepShare, step: int) -> tuple[list, list]:
        """The step's grad_accum micro-batches, forward and backward, the engine reducing in the last one's
        backward; their per-sample losses and tokens."""
        k, w = self.options.grad_accum, self.wrapped
        losses, tokens = [], []
        for micro, batch in zip(range(k), self.telemetry.batches(share.batches, step)):
            real = micro < share.real  # else a repeat with weight 0: a rank out of data (StepShare)
            with gradient_sync(w, on=micro == k - 1):
                out = forward_backward(w, self.data.step, batch, self.data.loss, Weighting(k, share.scale, real))
            if real:
                losses.append(out.loss.detach())
                tokens.append(out.tokens)
        return losses, tokens

    def _step_done(self, step: int, losses: list[torch.Tensor], tokens: list = (), stepped: bool = True,
                   global_loss: torch.Tensor | None = None) -> None:
        """The step's per-sample losses (and tokens, where the step counts them) into the meters; none when its
        optimizer step was skipped. global_loss: the step's loss over every rank, summed in an order of its own
        (trainer.invariant)."""
        self.telemetry.heartbeat.beat(step, "step_end")
        if not stepped:
            self.state.totals.skipped_steps += 1
            self.say(f"step {step}: non-finite loss or gradient, step skipped (trainer.on_nonfinite=skip)")
        self.telemetry.meter.add(StepRecord(step, list(losses), list(tokens), global_loss, skipped=not stepped,
                                            data_seconds=self.telemetry.take_data_seconds()))
        stuck = self.skips.record(step, stepped)
        if stuck:
            raise TrainingStopped(f"{stuck}; stopped; {self._kept()}. Lower optimizer.lr, set trainer.grad_clip or "
                                  "use trainer.precision=fp32")

    def _log(self, step: int) -> None:
        self.telemetry.heartbeat.beat(step, "log")
        meter = self.telemetry.meter
        rows = self.group.all_gather(meter.rows()).reshape(-1, len(meter.columns)).cpu()
        meter.reset()
        self._stop_if_nonfinite(rows)
        report, logged = None, self.state.take_logged()
        if self.group.is_main:
            summary = IntervalSummary.from_rows(rows, meter.kinds)
            self.state.totals.add(summary)
            report = self.telemetry.per_gpu.report(summary, logged)
        self.callbacks.on_log(self.state, step, report)

    def _stop_if_nonfinite(self, rows: torch.Tensor) -> None:
        """Every rank sees the same gathered rows, so every rank stops at the same boundary."""
        first = rows[:, FRAME.index("first_nonfinite_step")].tolist()
        bad = [(rank, int(s)) for rank, s in enumerate(first) if s > 0]
        if not bad:
            return
        rank, step = min(bad, key=lambda b: b[1])
        raise TrainingStopped(
            f"the training loss became NaN/inf at step {step} on rank {rank}; stopped "
            f"(trainer.on_nonfinite=stop); {self._kept()}. Lower optimizer.lr, set trainer.grad_clip, "
            "use trainer.precision=fp32, or trainer.on_nonfinite=skip"
        )

    def _kept(self) -> str:
        last = self.checkpointer.last_saved()
        return f"the last good checkpoint is {last}" if last else "no checkpoint had been written yet"

    def _evaluate(self, step: int) -> None:
        main = self.group.is_main
        self.callbacks.on_evaluation_start(self.state, step)
        with ExitStack() as stack:
            for context in self.state.evaluation_contexts:
                stack.enter_context(context())
            result = evaluate(self.group, self.wrapped, self.data,
                              on_batch=lambda batch: self.telemetry.heartbeat.beat(step, "evaluate", batch))
        self.lr_schedule.evaluated(self.state.objective_value(result))  # every rank: the same result and decision
        if main:
            self.state.totals.val_loss, self.state.totals.val_metrics = result.loss, result.metrics
        self.callbacks.on_evaluation_end(self.state, step, result if main else None)


@torch.no_grad()
def evaluate(group: ProcessGroup, wrapped: Wrapped, data: LoopData, on_batch=None) -> EvalResult:
    """The test split through the step on every rank (each its share), the metrics over all of it: every rank gets
    the same result. The training loop's evaluation, and eval.py's."""
    model = wrapped.evaluation_model()
    model.eval()
    metrics = EvalMetrics(data.metrics, group)
    for batch in data.eval_batches():
        if on_batch is not None:
            on_batch(batch)
        filler = isinstance(batch, Filler)  # a rank out of data runs the forward its peers gather in
        with wrapped.precision.autocast():
            out = data.step(model, batch.batch if filler else batch, data.loss)
        if not filler:
            metrics.update(per_sample_losses(out.loss, out.samples), out.outputs, out.targets)
    loss, values = metrics.compute()
    return EvalResult(loss, values)
