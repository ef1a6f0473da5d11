"""A stopped sweep run again into its folder (`python train.py -m <same overrides> hydra.sweep.dir=<sweep folder>`):
job folders are named by job number and what varies (framework/results/job_names.py), so each job finds its own
folder again. A job whose folder holds result.json and the same resolved config is not trained again: its result
is reported; a job that had started resumes from its last checkpoint (trainer.resume=auto, the default); the others
run. A finished job of another config is refused in one line (its folder is not overwritten). A key that a newer
hydra-dist added, which the job's saved config lacks, is not a difference while it keeps its schema's default, and
an earlier version's strategy class is today's (framework/config/legacy_targets.py): a sweep started before an
upgrade resumes after it."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from framework.common.errors import ConfigError
from framework.config.legacy_targets import current_target
from framework.config.schemas import NO_DEFAULT, schema_default
from framework.results.result_file import RESOLVED_CONFIG, read_result


def changed_keys(before: dict, now: dict, prefix: str = "", default_of=lambda key: NO_DEFAULT) -> list[str]:
    """The dotted keys whose values differ between two resolved configs; a key only one of them has is the same when
    its value there is `default_of(key)`."""
    keys = []
    for key in dict.fromkeys([*before, *now]):
        a, b, name = before.get(key), now.get(key), f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            keys += changed_keys(a, b, f"{name}.", default_of)
        elif (key in before) != (key in now):
            if (a if key in before else b) != default_of(name):
                keys.append(name)
        elif a != b:
            keys.append(name)
    return keys


def finished_before(run_dir: Path, cfg: DictConfig) -> dict | None:
    """The result.json of this job folder when a run of this same config (resolved) finished there; None when none
    did. Raises ConfigError when the folder holds a finished run of another config."""
    result = read_result(run_dir)
    if result is None:
        return None
    resolved = OmegaConf.to_container(cfg, resolve=True)
    try:
        saved = OmegaConf.to_container(OmegaConf.load(run_dir / RESOLVED_CONFIG))
    except (OSError, ValueError):
        saved = None
    if isinstance(saved, dict) and isinstance(saved.get("strategy"), dict) and "_target_" in saved["strategy"]:
        # an earlier version's name of the same engine (ddp and fsdp before they became the mesh's presets)
        saved["strategy"]["_target_"] = current_target(saved["strategy"]["_target_"])
    changed = changed_keys(saved, resolved, default_of=lambda key: schema_default(resolved, key)) if isinstance(saved, dict) else ["(no resolved_config.yaml)"]
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise ConfigError(f"hydra.sweep.dir={run_dir.parent} is not allowed for this job: {run_dir.name} finished "
                          f"there with another config ({shown} differ); run the sweep into a new folder")
    return result


def objective_value(result: dict) -> float:
    return result["test_loss"] if result["objective"] == "loss" else result[f"test_{result['objective']}"]
