"""Hydra callback: after a multirun, one table of every job (printed, and saved as summary.md + summary.csv
in the sweep folder), with a column for each override that varies; a sweep over trainer.seed adds a table per
config with each metric's mean ± sd over its seeds (framework/results/seed_groups.py). Reads each job's result.json
(and a failed job's reason from its train.log: framework/results/failure_note.py), so it works with any launcher. A sweep over the number of workers also gets scaling.md (framework/results/scaling.py)."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from framework.session.exit import end_through_the_interpreter
from framework.results.failure_note import LOG, failure_of
from framework.results.job_names import overrides_by_key
from framework.results.result_file import format_rate, read_result
from framework.results.scaling import SCALING_FILE, write_scaling
from framework.results.seed_groups import (SEED_KEY, Job, SeedGroup, group_by_seed, mean_sd, metric_names,
                                           objective_of, varying)
from framework.results.seed_hparams import write_seed_hparams

BEFORE_METRICS = ("job", "overrides", "status", "train_loss", "test_loss")
AFTER_METRICS = ("samples_per_sec", "per_rank_samples_per_sec", "run_dir")
ERROR = "error"  # a failed job's reason, from its train.log (framework/results/failure_note.py)
SEEDS_CSV = "summary_seeds.csv"


def columns(rows: list[dict], varying_keys: list[str]) -> list[str]:
    """job, one column per override that varies, then the fixed columns around one test_<metric> column for
    every metric any job reported; last, why a job failed, when one did."""
    metrics = [key for row in rows for key in row if key.startswith("test_") and key not in BEFORE_METRICS]
    failed = [ERROR] if any(ERROR in row for row in rows) else []
    return [BEFORE_METRICS[0], *varying_keys, *BEFORE_METRICS[1:], *dict.fromkeys(metrics), *AFTER_METRICS, *failed]


def jobs_of(sweep_dir: Path) -> list[tuple[Path, Job]]:
    """Every job folder of the sweep (a folder with .hydra/) with its overrides and result, in job order."""
    found = []
    for job_dir in (p for p in sweep_dir.iterdir() if (p / ".hydra").is_dir()):
        result = read_result(job_dir)
        if result is None:
            overrides = list(OmegaConf.load(job_dir / ".hydra" / "overrides.yaml"))
            number = OmegaConf.load(job_dir / ".hydra" / "hydra.yaml").hydra.job.num  # whatever the folder's name
            found.append((job_dir, Job(int(number), overrides, None)))
        else:
            found.append((job_dir, Job(int(result["job"]), list(result["overrides"]), result)))
    return sorted(found, key=lambda pair: pair[1].number)


def row_of(job_dir: Path, job: Job) -> dict:
    values = overrides_by_key(job.overrides)
    common = {**values, "job": str(job.number), "overrides": " ".join(job.overrides), "run_dir": str(job_dir)}
    result = job.result
    if result is None:
        return {**common, "status": "failed", ERROR: failure_of(job_dir) or f"no reason noted: see {job_dir}/{LOG}"}
    return {
        **common,
        "status": "ok",
        "train_loss": f"{result['train_loss']:.4f}",
        "test_loss": f"{result['test_loss']:.4f}",
        **{f"test_{name}": f"{result[f'test_{name}']:.4f}" for name in result.get("metrics", [])},
        "samples_per_sec": format_rate(result["samples_per_sec"]),
        "per_rank_samples_per_sec": " / ".join(format_rate(r) for r in result["per_rank_samples_per_sec"]),
    }


def to_markdown(rows: list[dict], names: list[str]) -> str:
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(str(r.get(c, "")).replace("|", "\\|") for c in names) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, rows: list[dict], names: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def seed_tables(groups: list[SeedGroup], keys: list[str], metrics: list[str]) -> tuple[list[dict], list[dict]]:
    """(markdown rows: mean ± sd; csv rows: <metric>_mean and <metric>_sd apart) of the seed groups."""
    shown, raw = [], []
    for group in groups:
        values = overrides_by_key(group.overrides)
        common = {**{k: values.get(k, "") for k in keys}, "n": group.n, "failed": group.failed,
                  "best": "*" if group.best else ""}
        shown.append({**common, **{m: mean_sd(group, m, 0 if m == "samples_per_sec" else 4) for m in metrics}})
        raw.append({**common, "overrides": " ".join(group.overrides), "seeds": " ".join(group.seeds),
                    **{f"{m}_{what}": value for m in metrics
                       for what, value in (("mean", group.mean(m)), ("sd", group.sd(m))) if value is not None}})
    return shown, raw


def write_summary(sweep_dir: Path) -> str:
    """summary.md, summary.csv (one row per job) and, for a sweep over trainer.seed, summary_seeds.csv (one row
    per config) and the seed groups' HParams (framework/results/seed_hparams.py); for a sweep over the number of
    workers, scaling.md (framework/results/scaling.py). Returns summary.md's markdown."""
    found = jobs_of(sweep_dir)
    jobs = [job for _, job in found]
    keys = varying(jobs)
    rows = [row_of(job_dir, job) for job_dir, job in found]
    names = columns(rows, keys)
    markdown = to_markdown(rows, names)
    write_csv(sweep_dir / "summary.csv", rows, names)
    groups = group_by_seed(jobs)
    if groups:
        config_keys, metrics = [k for k in keys if k != SEED_KEY], metric_names(jobs)
        shown, raw = seed_tables(groups, config_keys, metrics)
        first = next((job.result for job in jobs if job.result), None)  # None: every job failed
        objective = objective_of(first)[0] if first else "objective"
        markdown += (f"\nper config over its seeds ({SEED_KEY}): mean ± sd, n seeds; best {objective} marked *\n\n"
                     + to_markdown(shown, [*config_keys, "n", "failed", *metrics, "best"]))
        write_csv(sweep_dir / SEEDS_CSV, raw, [*config_keys, "overrides", "n", "failed", "seeds",
                                               *(f"{m}_{w}" for m in metrics for w in ("mean", "sd")), "best"])
        write_seed_hparams(sweep_dir, groups, config_keys, metrics)
    (sweep_dir / "summary.md").write_text(markdown)
    write_scaling(sweep_dir, found)
    return markdown


class SweepSummary(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        end_through_the_interpreter()  # the launcher's pools go with the interpreter (framework/session/exit.py)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        markdown = write_summary(sweep_dir)
        print(f"\nsweep summary ({sweep_dir}/summary.md, summary.csv):\n{markdown}", flush=True)
        if (sweep_dir / SCALING_FILE).is_file():
            print(f"scaling ({sweep_dir / SCALING_FILE}):\n{(sweep_dir / SCALING_FILE).read_text()}", flush=True)
        failed = [job for _, job in jobs_of(sweep_dir) if job.result is None]
        if failed:  # every job ran; the sweep as a whole still reports failure
            sys.exit(f"error: {len(failed)} sweep job(s) failed: " + ", ".join(str(job.number) for job in failed))
