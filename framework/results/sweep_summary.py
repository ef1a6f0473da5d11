"""Hydra callback: after a multirun, one table of every job (printed, and saved as summary.md + summary.csv
in the sweep folder). Reads each job's result.json, so it works with any launcher."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from framework.process.clean_exit import end_through_the_interpreter
from framework.results.result_file import format_rate, read_result

BEFORE_METRICS = ("job", "overrides", "status", "train_loss", "test_loss")
AFTER_METRICS = ("samples_per_sec", "per_rank_samples_per_sec", "run_dir")


def columns(rows: list[dict]) -> list[str]:
    """The fixed columns around one test_<metric> column for every metric any job reported."""
    metrics = [key for row in rows for key in row if key.startswith("test_") and key not in BEFORE_METRICS]
    return [*BEFORE_METRICS, *dict.fromkeys(metrics), *AFTER_METRICS]


def summarize(sweep_dir: Path) -> list[dict]:
    rows = []
    for job_dir in sorted(p for p in sweep_dir.iterdir() if (p / ".hydra").is_dir()):
        result = read_result(job_dir)
        if result is None:
            overrides = OmegaConf.load(job_dir / ".hydra" / "overrides.yaml")
            rows.append({"job": job_dir.name.split("_")[0], "overrides": " ".join(overrides), "status": "failed",
                         "run_dir": str(job_dir)})
            continue
        rows.append({
            "job": result["job"],
            "overrides": " ".join(result["overrides"]),
            "status": "ok",
            "train_loss": f"{result['train_loss']:.4f}",
            "test_loss": f"{result['test_loss']:.4f}",
            **{f"test_{name}": f"{result[f'test_{name}']:.4f}" for name in result.get("metrics", [])},
            "samples_per_sec": format_rate(result["samples_per_sec"]),
            "per_rank_samples_per_sec": " / ".join(format_rate(r) for r in result["per_rank_samples_per_sec"]),
            "run_dir": str(job_dir),
        })
    rows.sort(key=lambda r: int(r["job"]))
    return rows


def to_markdown(rows: list[dict]) -> str:
    names = columns(rows)
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in names) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_summary(sweep_dir: Path) -> list[dict]:
    rows = summarize(sweep_dir)
    (sweep_dir / "summary.md").write_text(to_markdown(rows))
    with open(sweep_dir / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns(rows))
        writer.writeheader()
        writer.writerows(rows)
    return rows


class SweepSummary(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        end_through_the_interpreter()  # the launcher's pools go with the interpreter (framework/process/clean_exit.py)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        rows = write_summary(sweep_dir)
        print(f"\nsweep summary ({sweep_dir}/summary.md, summary.csv):\n{to_markdown(rows)}", flush=True)
        failed = [r for r in rows if r["status"] != "ok"]
        if failed:  # every job ran; the sweep as a whole still reports failure
            sys.exit(f"error: {len(failed)} sweep job(s) failed: " + ", ".join(str(r["job"]) for r in failed))
