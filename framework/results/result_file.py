"""A finished run's result.json: written atomically by the driver, read by the sweep summary; and its
resolved_config.yaml, read back by the loggers, the sweep's reports and eval.py."""
from __future__ import annotations

import json
import os
from pathlib import Path

from omegaconf import OmegaConf

RESULT_FILE = "result.json"
RESOLVED_CONFIG = "resolved_config.yaml"  # the run's config, every interpolation resolved (framework/run.py)


def write_result(run_dir: Path, result: dict) -> Path:
    """result (RunResult.to_json()) into run_dir/result.json, atomically."""
    path = run_dir / RESULT_FILE
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_result(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None


def read_resolved_config(run_dir: Path) -> dict:
    """A run folder's resolved_config.yaml as plain data; {} where it has none."""
    path = run_dir / RESOLVED_CONFIG
    return OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else {}


def format_rate(value: float) -> str:
    return f"{value:,.0f}"
