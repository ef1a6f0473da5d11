"""Reading the runs W&B itself wrote (logger=wandb, offline) with W&B's own reader: `wandb leet inspect --json`
prints every record of a run's transaction log (run-<id>.wandb: the run with its config, group and job type, each
history row, the summary, the exit). wandb 0.31 has no Python reader of that file; this command is W&B's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support.run_files import walk


@dataclass
class WandbRun:
    path: Path  # run-<id>.wandb
    records: list[dict]

    def _of(self, kind: str) -> list[dict]:
        return [r[kind] for r in self.records if r.get("type") == kind]

    @property
    def run(self) -> dict:
        return self._of("run")[0]

    @property
    def run_id(self) -> str:
        return self.run["run_id"]

    @property
    def config(self) -> dict:
        return {k: v for k, v in self.run["config"]["update"].items() if k != "_wandb"}

    @property
    def exit_code(self) -> int | None:
        exits = self._of("exit")
        return exits[-1].get("exit_code", 0) if exits else None

    @property
    def summary(self) -> dict:
        merged = {}
        for update in self._of("summary"):
            merged.update(update.get("update", {}))
        return merged

    def history(self) -> dict[str, list[tuple[int, float]]]:
        """Each logged tag's (step, value) in order, W&B's own columns (_step, _runtime, ...) left out."""
        tags: dict[str, list[tuple[int, float]]] = {}
        for row in self._of("history"):
            step = int(row.get("step", {}).get("num", 0))
            for tag, value in row["item"].items():
                if not tag.startswith("_"):
                    tags.setdefault(tag, []).append((step, value))
        return tags


def wandb_runs(root: Path) -> list[WandbRun]:
    """Every W&B run file under root, in path order, read by W&B's reader (offline: it uploads nothing)."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_ERROR_REPORTING": "false"}
    runs = []
    for path in walk(root, "run-*.wandb"):
        out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)], env=env,
                             capture_output=True, text=True, timeout=120, check=True).stdout
        runs.append(WandbRun(path, [json.loads(line) for line in out.splitlines() if line.strip()]))
    return runs
