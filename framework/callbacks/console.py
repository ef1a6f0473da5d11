"""Rank 0's progress on the console and in train.log: one line (or the live bar, on a terminal) per log interval,
one per evaluation, and the straggler lines (framework/telemetry/progress.py draws them)."""
from __future__ import annotations

from framework.callbacks.base import Callback
from framework.telemetry.model_summary import as_lines, summarize
from framework.telemetry.progress import Progress


def metric_label(name: str) -> str:
    return "accuracy" if name == "acc" else name


class ConsoleLog(Callback):
    def on_fit_start(self, trainer) -> None:
        if trainer.is_main:
            trainer.say(f"model: {type(trainer.wrapped.module).__name__}, parameters per module")
            for line in as_lines(summarize(trainer.wrapped.module)):
                trainer.say(line)

    def on_log(self, trainer, step: int, report) -> None:
        if report is None:
            return
        s = report.summary
        for straggler in report.stragglers:
            trainer.say(straggler.line(step, report.straggler_threshold))
        per_rank = ", ".join(f"{r:,.0f}" for r in s.per_slot_samples_per_sec)
        data_share = 100 * s.data_ms / s.step_ms if s.step_ms else 0.0
        epoch = trainer.epoch + 1
        trainer.say(
            f"epoch {epoch}/{trainer.epochs} step {step}/{trainer.total_steps or '?'} | loss {s.loss:.4f} | "
            f"{s.samples_per_sec:,.0f} samples/s (per rank: {per_rank}) | data {data_share:.0f}% of step",
            progress=Progress(step, trainer.total_steps, epoch, trainer.epochs, s.loss, s.samples_per_sec,
                              s.samples_per_sec / trainer.options.batch_size) if trainer.total_steps else None,
        )

    def on_evaluation_end(self, trainer, step: int, result) -> None:
        if result is None:
            return
        shown = "".join(f" | test {metric_label(name)} {value:.4f}" for name, value in result.metrics.items())
        at = f" step {step}/{trainer.total_steps or '?'}" if trainer.options.eval_every_n_steps else ""
        trainer.say(f"epoch {trainer.epoch + 1}/{trainer.epochs}{at} test loss {result.loss:.4f}{shown}")
