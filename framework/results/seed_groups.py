"""A sweep over trainer.seed, per config (every override but the seed): n, and the mean and sample standard deviation
of each metric over its seeds; the config whose mean objective (trainer.objective) is best is marked."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from framework.results.job_names import overrides_by_key

SEED_KEY = "trainer.seed"


@dataclass
class Job:
    """One job of the sweep as its folder holds it: its overrides, and its result.json (None: it failed)."""

    number: int
    overrides: list[str]
    result: dict | None


@dataclass
class SeedGroup:
    overrides: list[str]  # every override of its jobs but the seed
    seeds: list[str]  # of the jobs that finished
    failed: int
    values: dict[str, list[float]]  # metric -> one value per finished job
    best: bool = False

    @property
    def n(self) -> int:
        return len(self.seeds)

    def mean(self, metric: str) -> float | None:
        values = self.values.get(metric, [])
        return statistics.fmean(values) if values else None

    def sd(self, metric: str) -> float | None:
        values = self.values.get(metric, [])
        return statistics.stdev(values) if len(values) > 1 else None


def varying(jobs: list[Job]) -> list[str]:
    """The keys whose value is not the same in every job (in the order the jobs name them)."""
    by_job = [overrides_by_key(job.overrides) for job in jobs]
    keys = dict.fromkeys(key for found in by_job for key in found)
    return [key for key in keys if len({found.get(key) for found in by_job}) > 1]


def metric_names(jobs: list[Job]) -> list[str]:
    """result.json's numbers a seed group averages: losses, each test metric, samples/s."""
    tests = [f"test_{name}" for job in jobs if job.result for name in job.result.get("metrics", [])]
    return ["train_loss", "test_loss", *dict.fromkeys(tests), "samples_per_sec"]


def group_by_seed(jobs: list[Job]) -> list[SeedGroup]:
    """One group per config when the sweep varies trainer.seed (else none), in the order of their first job; the
    best one marked."""
    if SEED_KEY not in varying(jobs):
        return []
    metrics, groups = metric_names(jobs), {}
    for job in jobs:
        config = [o for o in job.overrides if o.lstrip("+").partition("=")[0] != SEED_KEY]
        group = groups.setdefault(tuple(config), SeedGroup(config, [], 0, {m: [] for m in metrics}))
        if job.result is None:
            group.failed += 1
            continue
        group.seeds.append(overrides_by_key(job.overrides).get(SEED_KEY, ""))
        for metric in metrics:
            if metric in job.result:
                group.values[metric].append(float(job.result[metric]))
    found = list(groups.values())
    _mark_best(found, next((job.result for job in jobs if job.result), None))
    return found


def objective_of(result: dict) -> tuple[str, bool]:
    """(result.json's key of trainer.objective, whether higher is better)."""
    name = result.get("objective", "loss")
    higher = result.get("objective_higher_is_better", name != "loss")
    return ("test_loss" if name == "loss" else f"test_{name}"), higher


def _mark_best(groups: list[SeedGroup], result: dict | None) -> None:
    if result is None:
        return
    metric, higher = objective_of(result)
    scored = [(g.mean(metric), g) for g in groups if g.mean(metric) is not None]
    if scored:
        best = (max if higher else min)(scored, key=lambda pair: pair[0])[1]
        best.best = True


def mean_sd(group: SeedGroup, metric: str, digits: int) -> str:
    mean, sd = group.mean(metric), group.sd(metric)
    if mean is None:
        return ""
    return f"{mean:.{digits}f}" if sd is None else f"{mean:.{digits}f} ± {sd:.{digits}f}"
