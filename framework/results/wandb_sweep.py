"""Hydra callback of logger=wandb in a sweep: before the first job it names the W&B group the sweep's jobs log to
(the sweep folder's name, kept in that folder: running the same sweep again keeps its group), so any launcher's jobs
find it (framework/results/wandb_tracking.py: sweep_group)."""
from __future__ import annotations

from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from framework.results.wandb_tracking import SWEEP_GROUP_FILE


class WandbSweep(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)  # claimed by ClaimRunFolder already, unless a user dropped it
        marker = sweep_dir / SWEEP_GROUP_FILE
        if not marker.is_file():
            marker.write_text(sweep_dir.resolve().name)
