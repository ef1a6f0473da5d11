"""<sweep>/optuna_trials.jsonl: one line each time a trial starts or ends (job number, state, parameters with
their distributions, values). The last line of a job is its state; a job whose last line says RUNNING was stopped
with the sweep."""
from __future__ import annotations

import json
import os
from pathlib import Path

from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.trial import FrozenTrial, Trial, TrialState, create_trial

RECORD_FILE = "optuna_trials.jsonl"


class TrialRecord:
    def __init__(self, sweep_dir: Path):
        self.path = sweep_dir / RECORD_FILE

    def last_by_job(self) -> dict[int, dict]:
        if not self.path.is_file():
            return {}
        last = {}
        for line in self.path.read_text().splitlines():
            if line.strip():
                try:
                    entry = json.loads(line)
                except ValueError:  # a line cut short by a kill: that job's earlier line stands
                    continue
                last[int(entry["job"])] = entry
        return dict(sorted(last.items()))

    def write(self, number: int, trial: Trial, state: TrialState, values: list[float] | None = None) -> None:
        entry = {"job": number, "state": state.name, "params": trial.params,
                 "distributions": {k: distribution_to_json(d) for k, d in trial.distributions.items()},
                 "values": values}
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())


def is_finished(entry: dict) -> bool:
    return TrialState[entry["state"]].is_finished()


def frozen_trial(entry: dict) -> FrozenTrial:
    """A finished job's trial, as Optuna's study.add_trial takes it."""
    return create_trial(state=TrialState[entry["state"]], values=entry["values"], params=entry["params"],
                        distributions={k: json_to_distribution(d) for k, d in entry["distributions"].items()})
