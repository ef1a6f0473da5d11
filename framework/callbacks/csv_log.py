"""logger=csv: rank 0 appends every log interval's scalars and every evaluation to <run folder>/metrics.csv, one row
per value (step, metric, value; the TensorBoard tag names, framework/telemetry/scalars.py), so any tool reads it
(`pandas.read_csv(...).pivot_table(index="step", columns="metric", values="value")`). A resumed run appends; steps
it redoes appear again, and the last row of a step wins (as in TensorBoard)."""
from __future__ import annotations

import csv

from framework.callbacks.base import Callback
from framework.results.run_scalars import METRICS_FILE
from framework.telemetry.scalars import eval_scalars, report_scalars

HEADER = ("step", "metric", "value")


class CSVLog(Callback):
    def __init__(self):
        self.file = self.writer = None

    def on_fit_start(self, state) -> None:
        if not state.is_main or self.file is not None:
            return
        path = state.run_dir / METRICS_FILE
        new = not path.is_file()
        self.file = open(path, "a", newline="")
        self.writer = csv.writer(self.file)
        if new:
            self.writer.writerow(HEADER)

    def _write(self, scalars: dict[str, float], step: int) -> None:
        self.writer.writerows((step, name, repr(float(value))) for name, value in scalars.items())

    def on_log(self, state, step: int, report) -> None:
        if report is None or self.writer is None:
            return
        self._write(report_scalars(report, state.lrs()), step)
        if state.checkpoint_due:  # everything logged up to a checkpoint is on disk before it
            self.file.flush()

    def on_evaluation_end(self, state, step: int, result) -> None:
        if result is not None and self.writer is not None:
            self._write(eval_scalars(result.loss, result.metrics), step)
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = self.writer = None
