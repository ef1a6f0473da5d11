"""`hydra/sweeper=resumable_optuna`: hydra-optuna-sweeper's Optuna sweeper, with the same keys, that

- keeps its study in the sweep folder (`<sweep>/optuna_trials.jsonl`: every trial's parameters and result);
- continues the study when the sweep is run again into its folder (`hydra.sweep.dir=<sweep>`): finished trials
  count toward n_trials, a trial that was running when the sweep stopped runs again with its own parameters and
  job number (so its job resumes from its checkpoint, or is reported from its result.json), new trials make up the
  rest;
- starts the next trial as soon as one ends (n_jobs at once, with a launcher that runs jobs side by side: joblib,
  submitit), instead of waiting for a whole batch of n_jobs trials.

The work is in _free_slot_study.py (Hydra skips modules named with a leading underscore when it scans plugins;
that one imports Optuna, which takes a second). No `from __future__ import annotations` here: Hydra runs this
module before it is in sys.modules, where dataclasses cannot resolve string annotations."""

import logging
from dataclasses import dataclass
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

try:  # the optional extra hydra-dist[optuna]; without it this sweeper is not offered
    from hydra_plugins.hydra_optuna_sweeper.config import OptunaSweeperConf
except ImportError:
    OptunaSweeperConf = None


def built(node: Any, key: str) -> Any:
    """A config node with _target_ (the sampler, under Hydra >= 1.4), built through the framework's allowlist with
    its own targets trusted; anything else (a sampler Hydra 1.3 built already) as it is."""
    if not (isinstance(node, (dict, DictConfig)) and "_target_" in node):
        return node
    from framework.config.targets import TargetAllowlist, allowing, instantiate  # with the sweeper, not the scan

    with allowing(TargetAllowlist.of_command({"node": node})):
        return instantiate(node, key)


class ResumableOptunaSweeper(Sweeper):
    def __init__(self, sampler: Any, direction: Any, storage: Optional[Any], study_name: Optional[str], n_trials: int,
                 n_jobs: int, max_failure_rate: float, search_space: Optional[DictConfig],
                 custom_search_space: Optional[str], params: Optional[DictConfig]) -> None:
        logging.getLogger("alembic").setLevel(logging.WARNING)  # imported by Optuna; its setup lines are noise
        from ._free_slot_study import FreeSlotStudy  # imports Optuna: only when this sweeper runs

        # Hydra >= 1.4 builds a plugin with _recursive_=False: the sampler arrives as its config, and the plugin
        # builds what it needs itself; what the sweep's own config names is trusted, as every target a user composes
        self.study = FreeSlotStudy(built(sampler, "hydra.sweeper.sampler"), direction, storage, study_name, n_trials,
                                   n_jobs, max_failure_rate, search_space, None, params)
        if custom_search_space:
            self.study.custom_search_space_extender = built(
                {"_target_": custom_search_space, "_partial_": True}, "hydra.sweeper.custom_search_space")

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.study.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> None:
        return self.study.sweep(arguments)


if OptunaSweeperConf is not None:
    @dataclass
    class ResumableOptunaConf(OptunaSweeperConf):
        _target_: str = "hydra_plugins.hydra_dist_sweepers.resumable_optuna.ResumableOptunaSweeper"
        n_jobs: int = 1  # trials at once (side by side only with a launcher that runs jobs elsewhere: joblib, submitit)

    ConfigStore.instance().store(group="hydra/sweeper", name="resumable_optuna", node=ResumableOptunaConf,
                                 provider="hydra-dist")
