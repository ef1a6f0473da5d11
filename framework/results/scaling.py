"""A sweep over the number of workers (`strategy.nproc_per_node=1,2,4`, horovod's `strategy.np`, a mesh's degrees,
`strategy=single,ddp`, `strategy=single,dp` on several GPUs) gets scaling.md beside summary.md: for each worker count, samples/s, the speedup and
efficiency against the smallest count, and each optimizer step's time split into compute, communication not hidden by
compute, waiting for data and waiting for the slowest rank; then one verdict line naming the largest loss and what to
try. The numbers are the jobs' own telemetry, read back from their TensorBoard events (or metrics.csv), so a sweep
stopped and resumed reports like any other.

Per job, each logged interval after the first (the first pays for start-up: the first batches, allocations, a
compile) weighs by its steps. Per optimizer step, from the per-rank tags (docs/telemetry.md):

    data           time/data_ms, the mean rank's wait for its batches
    compute        the mean rank's time/busy_ms less data: its own forward, backward and optimizer
    communication  the least time/wait_ms of any rank (the slowest rank waits only for the all-reduce's own transfer,
                   what compute did not hide), plus time/comm_ms where pipeline stages measure it
    slowest rank   the mean rank's time/wait_ms beyond that: waiting for the slowest rank to get there

They add up to time/step_ms. Where a strategy does not measure its waits (single, deepspeed ZeRO-3) the two
waits are not known and busy is the whole step."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from framework.results.result_file import format_rate, read_resolved_config
from framework.results.run_scalars import run_scalars
from framework.results.job_names import overrides_by_key
from framework.results.seed_groups import Job, varying

SCALING_FILE = "scaling.md"
# the keys that set how many workers a job has; the rest of a job's overrides say which jobs compare with which
WORKER_KEYS = ("strategy", "strategy.nproc_per_node", "strategy.np", "strategy.nnodes", "strategy.dp_replicate",
               "strategy.dp_shard", "strategy.tp", "strategy.pp")


@dataclass(kw_only=True)
class StepTime:
    """One job's optimizer step in ms, its parts, and its busiest rank."""

    step: float
    data: float
    compute: float
    communication: float | None  # None: this strategy does not measure its waits
    slowest_rank_wait: float | None
    busiest_rank: int
    busy: list[float]  # per rank


@dataclass
class Row:
    job: Job
    job_dir: Path
    workers: int
    global_batch: int
    samples_per_sec: float
    time: StepTime

    @property
    def group(self) -> tuple[str, ...]:
        """The job's overrides but those that set the number of workers."""
        return tuple(o for o in self.job.overrides if o.lstrip("+~").split("=", 1)[0] not in WORKER_KEYS)


def workers_of(result: dict) -> int:
    """The job's workers: its ranks, or dp's replicas (one process driving several GPUs), as its slots in
    TensorBoard."""
    return len(result.get("per_rank_samples_per_sec") or []) or int(result["processes"])


def varies_workers(jobs: list[Job]) -> bool:
    return len({workers_of(job.result) for job in jobs if job.result}) > 1


def weighted(series: dict[int, float], steps: list[int]) -> float | None:
    """The mean of a per-step quantity over the intervals ending at `steps` (after the first interval), each weighed by
    its steps."""
    kept = [(step, series[step], step - before) for before, step in zip(steps, steps[1:]) if step in series]
    if not kept:
        return None
    return sum(value * n for _, value, n in kept) / sum(n for _, _, n in kept)


def per_rank(scalars: dict, tag: str, steps: list[int]) -> list[float]:
    values, r = [], 0
    while f"{tag}/rank{r}" in scalars:
        value = weighted(scalars[f"{tag}/rank{r}"], steps)
        values.append(value if value is not None else float("nan"))
        r += 1
    return values


def step_time(scalars: dict[str, dict[int, float]], steps: list[int]) -> StepTime | None:
    step, data = weighted(scalars.get("time/step_ms", {}), steps), weighted(scalars.get("time/data_ms", {}), steps)
    busy = per_rank(scalars, "time/busy_ms", steps)
    if step is None or data is None or not busy:
        return None
    waits, comms = per_rank(scalars, "time/wait_ms", steps), per_rank(scalars, "time/comm_ms", steps)
    compute = statistics.fmean(busy) - data
    communication = straggling = None
    if waits:
        communication = min(waits) + (statistics.fmean(comms) if comms else 0.0)
        straggling = statistics.fmean(waits) - min(waits)
    return StepTime(step=step, data=data, compute=compute, communication=communication, slowest_rank_wait=straggling,
                    busiest_rank=max(range(len(busy)), key=busy.__getitem__), busy=busy)


def row_of(job_dir: Path, job: Job) -> Row | None:
    """A finished job's row, from its TensorBoard events (or metrics.csv); None when it logged too few intervals."""
    scalars = run_scalars(job_dir)
    rates = scalars.get("throughput/samples_per_sec", {})
    steps = sorted(rates)
    if len(steps) < 2:
        return None
    kept = [(rates[step], step - before) for before, step in zip(steps, steps[1:])]
    rate = sum(n for _, n in kept) / sum(n / r for r, n in kept if r > 0)
    timed = step_time(scalars, steps)
    if timed is None:
        return None
    return Row(job, job_dir, workers_of(job.result), int(job.result["global_batch"]), rate, timed)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _table(rows: list[Row]) -> list[str]:
    base = rows[0]
    lines = ["| workers | job | samples/s | speedup | efficiency | step ms | compute | communication not hidden | "
             "waiting for data | waiting for the slowest rank |", "|" + "---|" * 10]
    for row in rows:
        speedup = row.samples_per_sec / base.samples_per_sec
        efficiency = speedup / (row.workers / base.workers)
        t = row.time
        lines.append(f"| {row.workers} | {row.job.number} | {format_rate(row.samples_per_sec)} | {speedup:.2f}x | "
                     f"{efficiency:.0%} | {t.step:.1f} | {t.compute:.1f} | {_ms(t.communication)} | {t.data:.1f} | "
                     f"{_ms(t.slowest_rank_wait)} |")
    return lines


def verdict(base: Row, top: Row) -> str:
    """The largest count against the smallest: which part of its step grew beyond the smaller count's part scaled to
    its share of the work, and what to try."""
    speedup = top.samples_per_sec / base.samples_per_sec
    efficiency = speedup / (top.workers / base.workers)
    share = (base.workers / top.workers) * (top.global_batch / base.global_batch)  # of the smaller count's work
    b, t = base.time, top.time
    losses = {
        "compute": t.compute - b.compute * share,
        "waiting for data": t.data - b.data * share,
    }
    if t.communication is not None:
        losses["communication not hidden by compute"] = t.communication - (b.communication or 0.0) * share
        losses["waiting for the slowest rank"] = t.slowest_rank_wait - (b.slowest_rank_wait or 0.0) * share
    said = (f"verdict: {top.workers} workers train {speedup:.2f}x as fast as {base.workers} ({efficiency:.0%} "
            "efficiency)")
    largest = max(losses, key=losses.get)
    if losses[largest] <= 0:
        return said + "; no part of the step grew beyond its share of the work"
    said += f"; the largest loss is {largest}: {losses[largest]:.1f} ms of each {t.step:.1f} ms step"
    if t.communication is None:
        said += f" (strategy={top.job.result.get('strategy')} does not measure its waits: communication is in compute)"
    return f"{said}: {_advice(largest, top)}"


def _advice(part: str, row: Row) -> str:
    config = read_resolved_config(row.job_dir)
    strategy, trainer, dataset = config.get("strategy", {}), config.get("trainer", {}), config.get("dataset", {})
    if part == "compute":
        return f"each worker computes less efficiently {_work_of_a_worker(row, strategy)}: " + (
            "try a larger per-GPU batch (trainer.batch_size) or trainer.grad_accum")
    if part == "waiting for data":
        workers = trainer.get("num_workers", 0)
        memory = "" if dataset.get("in_memory", True) else ", or dataset.in_memory=true where the split is tensors"
        return f"try more DataLoader workers (trainer.num_workers, now {workers}){memory}"
    if part == "waiting for the slowest rank":
        busy = row.time.busy
        return (f"rank {row.time.busiest_rank} is the slowest (busy {max(busy):.1f} ms a step, the median rank "
                f"{statistics.median(busy):.1f} ms): see its time/busy_ms and the straggler lines (docs/telemetry.md)")
    tries = ["a larger per-GPU batch or trainer.grad_accum (fewer all-reduces per sample)"]
    ddp = all(strategy.get(degree, 1) == 1 for degree in ("dp_shard", "tp", "pp"))  # DDP's keys act there only
    if "bucket_cap_mb" in strategy and ddp:
        tries.append(f"strategy.bucket_cap_mb (now {strategy['bucket_cap_mb']:g})")
    if "compression" in strategy:
        tries.append(f"strategy.compression (now {strategy['compression']})")
    return "try " + ", ".join(tries)


def _work_of_a_worker(row: Row, strategy: dict) -> str:
    """What one worker computes of a step: its share of the batch where every degree splits the batch (ddp, fsdp,
    hsdp, deepspeed, horovod); where tp or pp split the model instead, its piece of the model on all the samples its
    data-parallel group sees (each tp and pp peer sees the same batch)."""
    tp, pp = int(strategy.get("tp") or 1), int(strategy.get("pp") or 1)
    samples = row.global_batch // max(1, row.workers // (tp * pp))
    if tp * pp == 1:
        return (f"on its {samples} samples a step (small batches keep a GPU half idle; CPU workers share the "
                "cores)")
    pieces = [f"1/{tp} of each split layer (tp={tp})" if tp > 1 else "",
              f"one of {pp} stages (pp={pp})" if pp > 1 else ""]
    return (f"on {' and '.join(filter(None, pieces))} for all {samples} samples of its data-parallel group a step "
            "(tp and pp split the model, not the batch: smaller matrices keep a GPU half idle; CPU workers share the "
            "cores)")


def scaling_report(found: list[tuple[Path, Job]]) -> str | None:
    """scaling.md's text for a sweep's jobs, or None when the sweep does not vary the number of workers."""
    jobs = [job for _, job in found]
    if not varies_workers(jobs):
        return None
    rows = [row for job_dir, job in found if job.result and (row := row_of(job_dir, job)) is not None]
    groups: dict[tuple[str, ...], list[Row]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    lines = ["# Scaling", "",
             "Each optimizer step's time in ms, the mean over the logged intervals after the first, from each job's "
             "telemetry (time/step_ms, time/busy_ms, time/wait_ms, time/data_ms, throughput/samples_per_sec); "
             "speedup and efficiency against the smallest number of workers. How to read it: docs/telemetry.md."]
    apart = [k for k in varying(jobs) if k not in WORKER_KEYS]  # what else the sweep varies: one table per value
    for members in groups.values():
        members.sort(key=lambda r: (r.workers, r.job.number))
        if len({r.workers for r in members}) < 2:
            continue
        values = overrides_by_key(members[0].job.overrides)
        heading = ["", "## " + " ".join(f"{k}={values.get(k, '')}" for k in apart)] if apart else []
        lines += [*heading, "", *_table(members), "", verdict(members[0], members[-1])]
    if not rows:
        lines += ["", "no job logged the telemetry this report reads: its TensorBoard events (logger=tensorboard) or "
                      "metrics.csv (logger=csv), two log intervals or more (trainer.log_every_n_steps)"]
    missing = [job.number for _, job in found if job.result is None]
    if missing:
        lines += ["", f"not in the table: job(s) {', '.join(map(str, missing))} (failed)"]
    return "\n".join(lines) + "\n"


def write_scaling(sweep_dir: Path, found: list[tuple[Path, Job]]) -> str | None:
    report = scaling_report(found)
    if report is not None:
        (sweep_dir / SCALING_FILE).write_text(report)
    return report

