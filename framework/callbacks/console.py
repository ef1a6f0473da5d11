"""Rank 0's progress on the console and in train.log: one line (or the live bar, on a terminal) per log interval,
one per evaluation, and the straggler lines (framework/telemetry/progress.py draws them)."""
from __future__ import annotations

from framework.callbacks.base import Callback
from framework.telemetry.model_summary import as_lines, summarize
from framework.telemetry.progress import Progress


def metric_label(name: str) -> str:
    return "accuracy" if name == "acc" else name


class ConsoleLog(Callback):
    def on_fit_start(self, state) -> None:
        if state.is_main:
            state.say(f"model: {type(state.model).__name__}, parameters per module")
            for line in as_lines(summarize(state.model)):
                state.say(line)

    def on_log(self, state, step: int, report) -> None:
        if report is None:
            return
        s = report.summary
        for straggler in report.stragglers:
            state.say(straggler.line(step, report.straggler_threshold))
        per_rank = ", ".join(f"{r:,.0f}" for r in s.per_slot_samples_per_sec)
        data_share = 100 * s.tags.get("time/data_ms", 0.0) / s.step_ms if s.step_ms else 0.0
        epoch = state.epoch + 1
        if not s.trained:
            state.say(f"epoch {epoch}/{state.epochs} step {step}/{state.total_steps or '?'} | all {s.steps} step(s) "
                      "since the last line skipped (non-finite loss or gradient)")
            return
        state.say(
            f"epoch {epoch}/{state.epochs} step {step}/{state.total_steps or '?'} | loss {s.loss:.4f} | "
            f"{s.samples_per_sec:,.0f} samples/s (per rank: {per_rank}) | data {data_share:.0f}% of step",
            progress=Progress(step=step, total_steps=state.total_steps, epoch=epoch, epochs=state.epochs,
                              loss=s.loss, samples_per_sec=s.samples_per_sec,
                              steps_per_sec=s.samples_per_sec / state.options.batch_size)
            if state.total_steps else None,
        )

    def on_evaluation_end(self, state, step: int, result) -> None:
        if result is None:
            return
        shown = "".join(f" | test {metric_label(name)} {value:.4f}" for name, value in result.metrics.items())
        at = f" step {step}/{state.total_steps or '?'}" if state.options.eval_every_n_steps else ""
        state.say(f"epoch {state.epoch + 1}/{state.epochs}{at} test loss {result.loss:.4f}{shown}")
