"""hydra/sweeper=resumable_optuna (hydra_plugins/hydra_dist_sweepers): an Optuna sweep stopped and run again into
its folder continues its study to n_trials, and with parallel jobs a freed slot takes the next trial at once."""
import csv
import json
import os
import shlex
import signal

import pytest
import yaml

from support.processes import (
    check_ok,
    faults_env,
    held_at,
    pin_accelerator,
    run_train,
    start_train,
    stop_in_second_job,
    wait_until_held,
)
from support.run_files import losses_by_step, run_dirs

RECORD = "optuna_trials.jsonl"


def study_args(*extra: str) -> list[str]:
    return ["-m", "hydra/sweeper=resumable_optuna", "hydra/sweeper/sampler=random", "hydra.sweeper.direction=maximize",
            "strategy=single", "dataset=synthetic", "dataset.train_size=1024", "dataset.test_size=64",
            "trainer.batch_size=32", "trainer.log_every_n_steps=1", *extra]


def record_lines(sweep_dir) -> list[dict]:
    return [json.loads(line) for line in (sweep_dir / RECORD).read_text().splitlines()]


def summary_rows(sweep_dir) -> list[dict]:
    with open(sweep_dir / "summary.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_an_optuna_sweep_stopped_in_a_trial_continues_its_study_to_n_trials(tmp_path, sig):
    args = study_args("hydra.sweeper.n_trials=3", "hydra.sweeper.sampler.seed=0", "optimizer.lr=interval(0.01,0.1)",
                      "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=2")
    proc, err, args = stop_in_second_job(args, tmp_path, sig)
    job0, job1 = run_dirs(tmp_path)
    sweep_dir = job0.parent
    assert [(e["job"], e["state"]) for e in record_lines(sweep_dir)] == [(0, "RUNNING"), (0, "COMPLETE"), (1, "RUNNING")]
    lr_of_trial_1 = record_lines(sweep_dir)[2]["params"]["optimizer.lr"]
    first_result = (job0 / "result.json").read_text()
    if sig == signal.SIGINT:
        assert proc.returncode == 128 + signal.SIGINT, err
        [line] = [line for line in err.splitlines() if line.startswith("To resume: ")]
        again = shlex.split(line.removeprefix("To resume: "))[2:]
        assert "hydra/sweeper=resumable_optuna" in again and again[-1] == f"hydra.sweep.dir={sweep_dir.absolute()}"
    else:  # nothing could say anything: the user names the folder
        assert proc.returncode == -signal.SIGKILL
        again = [*pin_accelerator(args), f"hydra.sweep.dir={sweep_dir}"]

    proc = run_train(again, tmp_path, env=faults_env())
    out = check_ok(proc)
    assert "1 trial(s) finished before, 1 stopped (run again), 1 new; n_trials=3" in proc.stderr + out
    assert f"resumed from {job1}/checkpoints/step-" in out  # trial 1 again, with its own job folder and lr
    assert sorted(losses_by_step(job1)) == list(range(1, 9))
    assert (job0 / "result.json").read_text() == first_result  # trial 0 was not run again
    entries = record_lines(sweep_dir)
    assert [(e["job"], e["state"]) for e in entries[3:]] == [(1, "RUNNING"), (1, "COMPLETE"), (2, "RUNNING"),
                                                              (2, "COMPLETE")]
    assert entries[3]["params"]["optimizer.lr"] == lr_of_trial_1
    rows = summary_rows(sweep_dir)
    assert [(r["job"], r["status"]) for r in rows] == [("0", "ok"), ("1", "ok"), ("2", "ok")]
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert round(best["best_value"], 4) == max(float(r["test_acc"]) for r in rows)  # over all three trials

    proc = run_train(again, tmp_path, env=faults_env())  # a finished study runs nothing more
    assert "3 trial(s) finished before, 0 stopped (run again), 0 new" in check_ok(proc) + proc.stderr
    assert len(run_dirs(tmp_path)) == 3 and len(record_lines(sweep_dir)) == 7


def test_with_two_slots_a_freed_slot_takes_the_next_trial_while_a_long_one_runs(tmp_path):
    # The random sampler with seed 8 draws 300, 4, 4, 4 steps: trial 0 is long, the others short. Batches of two
    # would hold trial 2 until trial 0 ends; free slots start trials 2 and 3 while it runs.
    args = study_args("hydra.sweeper.n_trials=4", "hydra.sweeper.sampler.seed=8", "trainer.max_steps=choice(4,300)",
                      "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweeper.n_jobs=2",
                      "trainer.log_every_n_steps=50", "dataset.train_size=9600")
    check_ok(run_train(args, tmp_path, timeout=300))
    sweep_dir = run_dirs(tmp_path)[0].parent
    events = [(e["job"], e["state"]) for e in record_lines(sweep_dir)]
    assert [e["params"]["trainer.max_steps"] for e in record_lines(sweep_dir) if e["state"] == "RUNNING"] == \
        [300, 4, 4, 4]
    assert events.index((3, "RUNNING")) < events.index((0, "COMPLETE")), events
    assert [r["status"] for r in summary_rows(sweep_dir)] == ["ok"] * 4


def test_ctrl_c_with_two_trials_running_side_by_side_stops_both_and_the_sweep_resumes_them(tmp_path):
    args = held_at(study_args("hydra.sweeper.n_trials=3", "hydra.sweeper.sampler.seed=1",
                              "optimizer.lr=interval(0.01,0.1)", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                              "hydra.sweeper.n_jobs=2", "dataset.train_size=4096", "trainer.max_steps=100",
                              "trainer.log_every_n_steps=5", "trainer.checkpoint_every_n_steps=5"), step=10, runs="[01]_*")
    proc = start_train(args, tmp_path, faults_env(), start_new_session=True)
    wait_until_held(proc, tmp_path, count=2)  # both trials at the end of step 10, side by side
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the driver and both jobs get it
    proc.wait(timeout=60)
    out = (tmp_path / "train.out").read_text() + (tmp_path / "train.err").read_text()
    assert proc.returncode == 128 + signal.SIGINT, out
    sweep_dir = run_dirs(tmp_path)[0].parent
    assert [(e["job"], e["state"]) for e in record_lines(sweep_dir)] == [(0, "RUNNING"), (1, "RUNNING")]
    assert out.count("stopped by SIGINT; all workers are stopped; the last complete checkpoint is ") == 2
    [command] = [line.removeprefix("To resume: ") for line in out.splitlines() if line.startswith("To resume: ")]

    proc = run_train(shlex.split(command)[2:], tmp_path, timeout=300, env=faults_env())
    out = check_ok(proc) + proc.stderr
    assert "0 trial(s) finished before, 2 stopped (run again), 1 new; n_trials=3, 2 at once" in out
    assert out.count("resumed from ") == 2
    assert [(r["job"], r["status"]) for r in summary_rows(sweep_dir)] == [("0", "ok"), ("1", "ok"), ("2", "ok")]
