"""A real sweep over the number of workers (`train.py -m strategy=ddp strategy.nproc_per_node=1,2`) writes scaling.md
beside summary.md, and its numbers are the runs' own: recomputed here from each job's TensorBoard events with
TensorBoard's reader. The arithmetic on every kind of job (no waits, a straggler, failed jobs, several tables):
tests/unit/test_scaling.py."""
import re
import statistics

import pytest

from support.processes import TINY
from support.run_files import read_scalars

SWEEP = ["-m", "strategy=ddp", "strategy.nproc_per_node=1,2", *TINY]


def after_the_first(series, steps):
    """The mean over the logged intervals after the first, each weighed by its steps."""
    pairs = [(series[s], s - before) for before, s in zip(steps, steps[1:])]
    return sum(v * n for v, n in pairs) / sum(n for _, n in pairs)


def expected_row(job_dir):
    scalars = {tag: dict(points) for tag, points in read_scalars(job_dir).items()}
    rates = scalars["throughput/samples_per_sec"]
    steps = sorted(rates)
    rate = sum(s - b for b, s in zip(steps, steps[1:])) / sum((s - b) / rates[s] for b, s in zip(steps, steps[1:]))
    ranks = sum(1 for tag in scalars if tag.startswith("time/busy_ms/rank"))
    busy = [after_the_first(scalars[f"time/busy_ms/rank{r}"], steps) for r in range(ranks)]
    wait = [after_the_first(scalars[f"time/wait_ms/rank{r}"], steps) for r in range(ranks)]
    data = after_the_first(scalars["time/data_ms"], steps)
    return ranks, rate, after_the_first(scalars["time/step_ms"], steps), statistics.fmean(busy) - data, min(wait), \
        data, statistics.fmean(wait) - min(wait)


@pytest.mark.core
def test_a_sweep_over_the_workers_writes_scaling_md_from_the_runs_own_telemetry(runs):
    run = runs.train(SWEEP).ok()
    jobs = run.jobs
    assert len(jobs) == 2
    report = (jobs[0].parent / "scaling.md").read_text()
    assert f"scaling (outputs/multirun/{jobs[0].parent.name}/scaling.md):\n# Scaling" in run.stdout
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in report.splitlines()
            if re.match(r"\| \d", line)]
    base_rate = None
    for job_dir, row in zip(jobs, rows):
        workers, rate, step, compute, communication, data, slowest = expected_row(job_dir)
        base_rate = base_rate or rate
        assert row == [str(workers), job_dir.name.split("_")[0], f"{rate:,.0f}", f"{rate / base_rate:.2f}x",
                       f"{rate / base_rate / workers:.0%}", f"{step:.1f}", f"{compute:.1f}", f"{communication:.1f}",
                       f"{data:.1f}", f"{slowest:.1f}"]
        assert float(row[5]) == pytest.approx(sum(map(float, row[6:])), abs=0.25), "the parts add up to the step"
    assert [row[0] for row in rows] == ["1", "2"]
    verdict = report.strip().splitlines()[-1]
    assert re.fullmatch(r"verdict: 2 workers train \d+\.\d\dx as fast as 1 \(\d+% efficiency\); the largest loss is "
                        r"(compute|waiting for data|communication not hidden by compute|waiting for the slowest rank): "
                        r"\d+\.\d ms of each \d+\.\d ms step: .+", verdict), verdict
