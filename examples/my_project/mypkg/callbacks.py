"""A user's own callback: every logged interval's loss and throughput, and every evaluation, as rows of a CSV file
in the run folder (rank 0 only: the report and the evaluation result exist there)."""
import csv

from framework.callbacks.base import Callback


class LossHistory(Callback):
    def __init__(self, file_name: str = "loss_history.csv"):
        self.file_name = file_name
        self.rows = []

    def on_log(self, state, step, report):
        if report is not None:
            self.rows.append({"step": step, "kind": "train", "loss": report.summary.loss,
                              "samples_per_sec": report.summary.samples_per_sec})

    def on_evaluation_end(self, state, step, result):
        if result is not None:
            self.rows.append({"step": step, "kind": "test", "loss": result.loss, "samples_per_sec": ""})

    def on_fit_end(self, state):
        if state.is_main:
            with open(state.run_dir / self.file_name, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=["step", "kind", "loss", "samples_per_sec"])
                writer.writeheader()
                writer.writerows(self.rows)
