"""Rank 0's TensorBoard events: every interval's throughput, loss, lr, memory and per-GPU tags, every evaluation,
and at the end the run's hyperparameters with its final metrics (the HParams tab). The tags and the Custom Scalars
layout are framework/telemetry/tensorboard_logger.py's. The event file is flushed at a log boundary that a
checkpoint follows, so everything logged up to a checkpoint is on disk before the checkpoint exists (and the writer
flushes by itself every 30 s)."""
from __future__ import annotations

from framework.callbacks.base import Callback
from framework.checkpoints.disk import OffWhenUnwritable
from framework.telemetry.model_summary import as_markdown, summarize
from framework.telemetry.tensorboard_logger import TensorBoardLogger


class TensorBoardLog(Callback):
    def __init__(self):
        self.writer = None

    def on_fit_start(self, state) -> None:
        if state.is_main and self.writer is None:
            logger = TensorBoardLogger(state.run_dir, state.device.type == "cuda")
            self.writer = OffWhenUnwritable(logger, "TensorBoard's event file", state.say)
            self.writer.log_text("model/summary", as_markdown(summarize(state.model)), state.step)

    def on_log(self, state, step: int, report) -> None:
        if report is None or self.writer is None:
            return
        self.writer.log_interval(step, report.summary, state.lrs())
        self.writer.log_per_gpu(step, report.summary, report.tflops, report.mfu,
                                [(g.rank, g.ratio, g.line(step, report.straggler_threshold)) for g in report.stragglers])
        self.writer.log_scalars(report.logged, step)
        if state.checkpoint_due:
            self.writer.flush()

    def on_evaluation_end(self, state, step: int, result) -> None:
        if result is not None and self.writer is not None:
            self.writer.log_eval(step, result.loss, result.metrics)

    def on_fit_end(self, state) -> None:
        if self.writer is None:
            return
        totals = state.totals
        self.writer.log_hparams(state.hparams(), {
            **{f"hparam/{name}": value for name, value in totals.final_metrics().items()},
            "hparam/samples_per_sec": totals.samples_per_sec,
        })

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
