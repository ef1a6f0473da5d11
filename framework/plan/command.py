"""`python plan.py [train.py's overrides] [plan.gpu=NAME] [plan.dir=DIR]` (`hydra-dist-plan`): will this run fit,
per rank, for each strategy and number of workers? No worker starts and no GPU is needed. Comma lists expand as a
sweep's would (`strategy=ddp,fsdp strategy.nproc_per_node=1,2,4`), every combination planned in this process; one
table (framework/plan/table.py), plan.json and plan.png in plan.dir. A refusal (a key, a strategy that cannot be planned yet,
an unknown GPU) is one `error:` line, exit 2, before anything is traced."""
from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

import framework.config  # noqa: F401  (registers the config schemas Hydra composes with)
from framework.cli import composition_error_line
from framework.common.errors import ConfigError
from framework.common.paths import CONF_DIR, config_dir_override, overrides_and_config_dir
from framework.config.hydra_versions import version_base
from framework.plan.gpus import Gpu, chosen_gpu
from framework.plan.largest_batch import largest_micro_batch
from framework.plan.picture import write_png
from framework.plan.rows import Row, check_plannable, plan_row
from framework.plan.table import table, write_json
from framework.session.situations import refuse

PLAN_FILE = "plan.json"
PICTURE_FILE = "plan.png"
WORKERS = "strategy.nproc_per_node"


@dataclass(frozen=True)
class PlanOptions:
    gpu: str | None = None  # a card by name (framework/plan/gpus.py); none: this machine's first GPU, if any
    dir: str = "outputs/plan"  # where plan.json goes (a folder per plan, named by its time)


def main() -> None:
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return
    try:
        overrides, config_dir = overrides_and_config_dir(sys.argv[1:], "hydra-dist-plan")
        options, overrides = plan_options(overrides)
        gpu = chosen_gpu(options.gpu)
        runs = list(composed_runs(overrides, config_dir))
        for cfg in runs:  # every refusal before anything is traced
            check_plannable(cfg)
        rows = [plan_row(cfg) for cfg in runs]
        largest = largest_batches(runs, rows, gpu) if gpu else {}
    except HydraException as exc:
        refuse(ConfigError(composition_error_line(exc)))
    except ConfigError as exc:
        refuse(exc)
    folder = Path(options.dir) / time.strftime("%Y-%m-%d_%H-%M-%S")
    folder.mkdir(parents=True, exist_ok=True)
    write_json(rows, gpu, largest, folder / PLAN_FILE)
    print(table(rows, gpu, largest))
    print(f"plan.json: {folder / PLAN_FILE}")
    print(write_png(rows, gpu, folder / PICTURE_FILE))


def largest_batches(runs: list, rows: list[Row], gpu: Gpu) -> dict[str, Row | None]:
    """Per strategy, at its row with the most workers: the largest micro-batch that fits the GPU."""
    widest = {}
    for cfg, row in zip(runs, rows):
        if row.strategy not in widest or row.workers > widest[row.strategy][1].workers:
            widest[row.strategy] = (cfg, row)
    return {name: largest_micro_batch(cfg, row, gpu.room(row.workers)) for name, (cfg, row) in widest.items()}


def plan_options(overrides: list[str]) -> tuple[PlanOptions, list[str]]:
    """plan.* taken out of the overrides (the rest compose the run); one line for a plan key it does not have."""
    known = PlanOptions.__dataclass_fields__
    values, rest = {}, []
    for override in overrides:
        key, _, value = override.partition("=")
        if not key.startswith("plan."):
            rest.append(override)
            continue
        name = key.removeprefix("plan.")
        if name not in known:
            raise ConfigError(f"{key} is not allowed: the plan's keys are {', '.join('plan.' + k for k in known)}")
        values[name] = value
    return PlanOptions(**values), rest


def composed_runs(overrides: list[str], config_dir: str | None):
    """The config of each combination of the comma lists, in sweep order, composed as train.py composes it. A
    strategy that starts one process (single, dp) has no strategy.nproc_per_node: its combinations are planned once,
    without it, and a line says so."""
    choices = []
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.get_key_element()
        values = list(override.sweep_string_iterator()) if override.is_sweep_override() else None
        choices.append([f"{key}={v}" for v in values] if values is not None else [override.input_line])
    extra = [config_dir_override(config_dir)] if config_dir else []
    planned, told = [], set()
    with initialize_config_dir(config_dir=str(CONF_DIR), **version_base()):
        for combination in itertools.product(*choices):
            without = [o for o in combination if not o.startswith(f"{WORKERS}=")]
            if len(without) < len(combination):
                alone = compose("config", overrides=[*without, *extra])
                if "nproc_per_node" not in alone.strategy:
                    if alone.strategy.name not in told:
                        print(f"strategy={alone.strategy.name} starts one process: planned once, without {WORKERS}")
                        told.add(alone.strategy.name)
                    combination = without
            if combination not in planned:
                planned.append(combination)
                yield compose("config", overrides=[*combination, *extra])

