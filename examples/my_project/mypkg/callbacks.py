"""A user's own callbacks. LossHistory: every logged interval's loss and throughput, and every evaluation, as rows of
a CSV file in the run folder (rank 0 only: the report and the evaluation result exist there). StopAtTarget: the run
ends at the first evaluation that reaches a value of trainer.objective, on every rank alike. What a hook may read
and call is its `state` (framework.callbacks.base.LoopState; docs/loop-features.md, "Writing a callback")."""
import csv

from framework.callbacks.base import Callback, LoopState


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


class StopAtTarget(Callback):
    """End the run at the first evaluation whose trainer.objective reaches `target`."""

    def __init__(self, target: float):
        self.target = float(target)

    def on_evaluation_end(self, state: LoopState, step: int, result) -> None:
        reached = None
        if state.is_main:  # the result is rank 0's (None on the other ranks)
            value = state.objective_value(result)
            reached = value >= self.target if state.higher_is_better else value <= self.target
        if state.broadcast_object(reached):  # a collective: every rank calls it, and every rank stops
            state.request_stop(f"{state.objective} reached {self.target:g} at step {step}")
