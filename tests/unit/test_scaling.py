"""scaling.md in this process, on sweep folders written here as finished jobs leave them (result.json, the telemetry
as logger=csv's metrics.csv, resolved_config.yaml): the step split, the first interval left out, the speedup, the
verdict's largest loss and advice, and when there is no report. A real 1-vs-2-worker sweep:
tests/runs/test_scaling.py."""
import csv
import json

import pytest

from framework.results.scaling import SCALING_FILE, scaling_report
from framework.results.sweep_summary import jobs_of, write_summary


def job(sweep, number, overrides, processes, intervals, strategy="ddp", config="strategy:\n  bucket_cap_mb: 25.0\n"):
    """A finished job: `intervals` maps each logged step to (samples/s, step ms, data ms, [busy ms], [wait ms] or
    None) per rank."""
    folder = sweep / f"{number}_job"
    (folder / ".hydra").mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({
        "job": number, "overrides": overrides, "processes": processes, "global_batch": 64, "strategy": strategy,
        "train_loss": 0.5, "test_loss": 0.6, "metrics": [], "samples_per_sec": 1.0,
        "per_rank_samples_per_sec": [1.0] * processes}))
    (folder / "resolved_config.yaml").write_text(config)
    with open(folder / "metrics.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["step", "metric", "value"])
        for step, (rate, step_ms, data_ms, busy, wait) in intervals.items():
            out.writerows([[step, "throughput/samples_per_sec", rate], [step, "time/step_ms", step_ms],
                           [step, "time/data_ms", data_ms]])
            out.writerows([step, f"time/busy_ms/rank{r}", b] for r, b in enumerate(busy))
            out.writerows([step, f"time/wait_ms/rank{r}", w] for r, w in enumerate(wait or []))
    return folder


def table_rows(report):
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in report.splitlines()
            if line.startswith("| ") and not line.startswith("| workers")]


def test_each_step_split_from_the_intervals_after_the_first(tmp_path):
    # one worker: 100 ms steps, 10 of them data; the first interval (start-up) is 5x slower and left out
    job(tmp_path, 0, ["strategy.nproc_per_node=1"], 1,
        {4: (100.0, 500.0, 50.0, [450.0], [0.0]), 8: (640.0, 100.0, 10.0, [100.0], [0.0]),
         16: (640.0, 100.0, 10.0, [100.0], [0.0])})
    # two workers: 70 ms steps of which 8 data; rank 1 is busy 60 ms, rank 0 42 ms and waits 28 for it; rank 1's
    # own wait (10 ms) is the all-reduce compute did not hide
    job(tmp_path, 1, ["strategy.nproc_per_node=2"], 2,
        {4: (100.0, 500.0, 50.0, [450.0, 450.0], [50.0, 50.0]), 8: (914.0, 70.0, 8.0, [42.0, 60.0], [28.0, 10.0]),
         16: (914.0, 70.0, 8.0, [42.0, 60.0], [28.0, 10.0])})
    report = scaling_report(jobs_of(tmp_path))
    assert table_rows(report) == [
        ["1", "0", "640", "1.00x", "100%", "100.0", "90.0", "0.0", "10.0", "0.0"],
        ["2", "1", "914", "1.43x", "71%", "70.0", "43.0", "10.0", "8.0", "9.0"]]
    # the shares of 2 workers: compute 90/2 = 45 (43: no loss), data 5 (8: 3 lost), communication 10, waiting 9
    assert report.strip().splitlines()[-1] == (
        "verdict: 2 workers train 1.43x as fast as 1 (71% efficiency); the largest loss is communication not hidden "
        "by compute: 10.0 ms of each 70.0 ms step: try a larger per-GPU batch or trainer.grad_accum (fewer "
        "all-reduces per sample), strategy.bucket_cap_mb (now 25)")


def test_the_slowest_rank_is_named_and_a_strategy_without_waits_says_so(tmp_path):
    job(tmp_path, 0, ["strategy.nproc_per_node=1"], 1, {4: (1.0, 9.0, 0.0, [9.0], [0.0]),
                                                         8: (640.0, 100.0, 0.0, [100.0], [0.0])})
    job(tmp_path, 1, ["strategy.nproc_per_node=2"], 2, {4: (1.0, 9.0, 0.0, [9.0, 9.0], [0.0, 0.0]),
                                                         8: (640.0, 100.0, 0.0, [40.0, 95.0], [60.0, 5.0])})
    assert "the largest loss is waiting for the slowest rank: 27.5 ms of each 100.0 ms step: rank 1 is the slowest " \
           "(busy 95.0 ms a step, the median rank 67.5 ms)" in scaling_report(jobs_of(tmp_path))
    fsdp = tmp_path / "fsdp"
    job(fsdp, 0, ["strategy.nproc_per_node=1"], 1, {4: (1.0, 9.0, 0.0, [9.0], None),
                                                     8: (640.0, 100.0, 0.0, [100.0], None)}, strategy="fsdp")
    job(fsdp, 1, ["strategy.nproc_per_node=2"], 2, {4: (1.0, 9.0, 0.0, [9.0, 9.0], None),
                                                     8: (800.0, 80.0, 0.0, [80.0, 80.0], None)}, strategy="fsdp")
    report = scaling_report(jobs_of(fsdp))
    assert table_rows(report)[1][-3:] == ["n/a", "0.0", "n/a"]
    assert "(strategy=fsdp does not measure its waits: communication is in compute)" in report



def test_the_compute_verdict_knows_that_tp_and_pp_split_the_model_not_the_batch(tmp_path):
    # tp=2 on 2 workers: each rank sees all 64 samples of the step (the data-parallel degree is 1), not 32
    for number, tp in enumerate([1, 2]):
        job(tmp_path, number, [f"strategy.tp={tp}"], tp, {4: (1.0, 9.0, 0.0, [9.0] * tp, None),
                                                          8: (640.0, 100.0, 0.0, [100.0] * tp, None)},
            strategy="tp", config=f"strategy:\n  tp: {tp}\n  pp: 1\n")
    report = scaling_report(jobs_of(tmp_path))
    assert ("the largest loss is compute: 50.0 ms of each 100.0 ms step (strategy=tp does not measure its waits: "
            "communication is in compute): each worker computes less efficiently on 1/2 of each split layer (tp=2) "
            "for all 64 samples of its data-parallel group a step (tp and pp split the model") in report
    # ddp on 2 workers: each computes its own 32 samples
    ddp = tmp_path / "ddp"
    for number, workers in enumerate([1, 2]):
        job(ddp, number, [f"strategy.nproc_per_node={workers}"], workers,
            {4: (1.0, 9.0, 0.0, [9.0] * workers, None), 8: (640.0, 100.0, 0.0, [100.0] * workers, None)},
            strategy="fsdp")
    assert "each worker computes less efficiently on its 32 samples a step" in scaling_report(jobs_of(ddp))

def test_one_table_per_other_setting_and_failed_jobs_listed(tmp_path):
    for number, (workers, lr) in enumerate([(1, "0.1"), (2, "0.1"), (1, "0.2"), (2, "0.2")]):
        job(tmp_path, number, [f"strategy.nproc_per_node={workers}", f"optimizer.lr={lr}"], workers,
            {4: (1.0, 9.0, 0.0, [9.0] * workers, [0.0] * workers),
             8: (600.0 * workers ** 0.5, 100.0, 0.0, [100.0] * workers, [0.0] * workers)})
    failed = tmp_path / "4_job"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "overrides.yaml").write_text("- strategy.nproc_per_node=4\n- optimizer.lr=0.1\n")
    (failed / ".hydra" / "hydra.yaml").write_text("hydra:\n  job:\n    num: 4\n")
    write_summary(tmp_path)
    report = (tmp_path / SCALING_FILE).read_text()
    assert [line for line in report.splitlines() if line.startswith("## ")] == ["## optimizer.lr=0.1",
                                                                               "## optimizer.lr=0.2"]
    assert [row[:4] for row in table_rows(report)] == [["1", "0", "600", "1.00x"], ["2", "1", "849", "1.41x"],
                                                       ["1", "2", "600", "1.00x"], ["2", "3", "849", "1.41x"]]
    assert report.strip().endswith("not in the table: job(s) 4 (failed)")


def test_jobs_without_telemetry_say_so(tmp_path):
    for number in range(2):
        folder = job(tmp_path, number, [f"strategy.nproc_per_node={number + 1}"], number + 1, {})
        (folder / "metrics.csv").unlink()
    assert scaling_report(jobs_of(tmp_path)).strip().endswith(
        "no job logged the telemetry this report reads: its TensorBoard events (logger=tensorboard) or metrics.csv "
        "(logger=csv), two log intervals or more (trainer.log_every_n_steps)")


@pytest.mark.parametrize("processes", [(1, 1), (2, 2)])
def test_no_report_when_the_workers_do_not_vary(tmp_path, processes):
    for number, workers in enumerate(processes):
        job(tmp_path, number, [f"optimizer.lr=0.{number + 1}"], workers,
            {4: (1.0, 9.0, 0.0, [9.0] * workers, None), 8: (600.0, 100.0, 0.0, [100.0] * workers, None)})
    write_summary(tmp_path)
    assert (tmp_path / "summary.md").is_file() and not (tmp_path / SCALING_FILE).exists()
