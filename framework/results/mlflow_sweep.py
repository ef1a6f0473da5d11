"""Hydra callback of logger=mlflow in a sweep: one parent run for the sweep, made before the first job (after the
sweep folder was claimed: conf/config.yaml lists the logger after hydra's callbacks) and named after the sweep
folder, whose id the jobs find in that folder (framework/callbacks/mlflow_log.py makes each job its child); at the
end the sweep's summary table as artifacts (written here: Hydra calls the end hooks in reverse order, so this one
comes before SweepSummary's) and the parent's status: FAILED when a job failed."""
from __future__ import annotations

from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from framework.results.mlflow_tracking import PARENT_RUN_FILE, client_for, experiment_id
from framework.results.scaling import SCALING_FILE
from framework.results.sweep_summary import SEEDS_CSV, jobs_of, write_summary

SUMMARY_FILES = ("summary.md", "summary.csv", SEEDS_CSV, SCALING_FILE)


class MLflowSweep(Callback):
    def __init__(self, tracking_uri: str | None = None, experiment: str = "hydra-dist"):
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self.client = self.run_id = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)  # claimed by ClaimRunFolder already, unless a user dropped it
        marker = sweep_dir / PARENT_RUN_FILE
        self.client = client_for(self.tracking_uri)
        if marker.is_file():  # the same sweep folder again: its parent goes on
            self.run_id = marker.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
            return
        run = self.client.create_run(experiment_id(self.client, self.experiment), run_name=sweep_dir.name,
                                     tags={"sweep_dir": str(sweep_dir.resolve()),
                                           "overrides": " ".join(config.hydra.overrides.task)})
        self.run_id = run.info.run_id
        marker.write_text(self.run_id)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if self.run_id is None:
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        write_summary(sweep_dir)
        for name in SUMMARY_FILES:
            if (sweep_dir / name).is_file():
                self.client.log_artifact(self.run_id, str(sweep_dir / name))
        failed = any(job.result is None for _, job in jobs_of(sweep_dir))
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
