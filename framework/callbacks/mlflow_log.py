"""logger=mlflow: rank 0 logs the run to an MLflow tracking store (framework/results/mlflow_tracking.py): the resolved
config as params, every log interval's scalars (the TensorBoard tags: framework/telemetry/scalars.py, per-rank
throughput included) and every evaluation as metrics by optimizer step, the resolved config, provenance and
(log_weights) weights/best.pt as artifacts, and the run's end as its status. A job of a sweep is a child of the
sweep's parent run. A resumed run goes on in the same MLflow run (its id is kept in the run folder)."""
from __future__ import annotations

import time
from pathlib import Path

from framework.callbacks.base import Callback
from framework.results.result_file import RESOLVED_CONFIG, read_resolved_config
from framework.results.mlflow_tracking import (client_for, experiment_id, flat_params, mlflow_api, parent_run_of,
                                               require_mlflow)
from framework.telemetry.scalars import eval_scalars, report_scalars

RUN_ID_FILE = "mlflow_run_id"
ARTIFACT_FILES = (RESOLVED_CONFIG, "provenance.json", "result.json")
BATCH = 100  # MLflow's log_batch takes at most 100 params and 1000 metrics per call


class MLflowLog(Callback):
    def __init__(self, tracking_uri: str | None = None, experiment: str = "hydra-dist", log_weights: bool = False):
        require_mlflow()
        self.tracking_uri, self.experiment, self.log_weights = tracking_uri, experiment, log_weights
        self.client = self.run_id = None

    def on_fit_start(self, state) -> None:
        if not state.is_main or self.client is not None:
            return
        self.client = client_for(self.tracking_uri)
        id_file = state.run_dir / RUN_ID_FILE
        if id_file.is_file():  # a resumed run
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
            return
        tags = {"run_dir": str(state.run_dir), **{f"hparam.{k}": str(v) for k, v in state.hparams().items()}}
        parent = parent_run_of(state.run_dir)
        if parent:
            tags["mlflow.parentRunId"] = parent
        run = self.client.create_run(experiment_id(self.client, self.experiment), run_name=state.run_dir.name,
                                     tags=tags)
        self.run_id = run.info.run_id
        id_file.write_text(self.run_id)
        self._log_params(state.run_dir)

    def _log_params(self, run_dir: Path) -> None:
        _, _, Param = mlflow_api()
        items = [Param(k, v) for k, v in flat_params(read_resolved_config(run_dir)).items()]
        for start in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, params=items[start:start + BATCH])

    def _log(self, scalars: dict[str, float], step: int) -> None:
        _, Metric, _ = mlflow_api()
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in scalars.items() if v == v]  # NaN: not measured
        for start in range(0, len(metrics), 10 * BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 10 * BATCH])

    def on_log(self, state, step: int, report) -> None:
        if report is None or self.run_id is None:
            return
        self._log(report_scalars(report, state.lrs()), step)

    def on_evaluation_end(self, state, step: int, result) -> None:
        if result is not None and self.run_id is not None:
            self._log(eval_scalars(result.loss, result.metrics), step)

    def on_fit_end(self, state) -> None:
        if self.run_id is None:
            return
        self._log(state.totals.final_metrics(), state.step)
        self._finish(state.run_dir, "FINISHED")

    def on_exception(self, state, exc: BaseException) -> None:
        if self.run_id is not None:
            self._finish(state.run_dir, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")

    def _finish(self, run_dir: Path, status: str) -> None:
        for name in ARTIFACT_FILES:
            if (run_dir / name).is_file():
                self.client.log_artifact(self.run_id, str(run_dir / name))
        best = run_dir / "weights" / "best.pt"
        if self.log_weights and best.is_file():
            self.client.log_artifact(self.run_id, str(best), "weights")
        self.client.set_terminated(self.run_id, status)
        self.run_id = None

