"""`train.py -m`: one folder per job named by what varies, none from workers, one summary table at the end, and a
seed sweep's mean ± sd per config (table, csv and TensorBoard's HParams)."""
import csv
import json
import shlex
import signal
import statistics

import pytest

from support.processes import TINY, TRAIN, check_ok, faults_env, pin_accelerator, run_train, stop_in_second_job
from support.run_files import losses_by_step, read_scalars, run_dirs


@pytest.mark.core
def test_sweep_makes_one_folder_per_job_and_a_summary(tmp_path):
    out = check_ok(run_train(["-m", "strategy=single,ddp", "model=lenet,simple_cnn", *TINY, "trainer.epochs=1"],
                             tmp_path, timeout=400))
    jobs = run_dirs(tmp_path)
    assert len(jobs) == 4
    assert len({j.parent for j in jobs}) == 1, "all jobs belong to one sweep folder"
    assert sorted(j.name.split("_", 1)[1] for j in jobs) == ["strategy=ddp_model=lenet", "strategy=ddp_model=simple_cnn",
                                                            "strategy=single_model=lenet",
                                                            "strategy=single_model=simple_cnn"]
    assert not (tmp_path / "outputs" / "runs").exists(), "no stray single-run folders"
    for job in jobs:
        assert "throughput/samples_per_sec/rank0" in read_scalars(job)

    sweep_dir = jobs[0].parent
    with open(sweep_dir / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1", "2", "3"]
    assert all(r["status"] == "ok" and 0.1 < float(r["test_acc"]) <= 1 and float(r["train_loss"]) > 0 for r in rows)
    assert {r["overrides"].split()[0] for r in rows} == {"strategy=single", "strategy=ddp"}
    assert [(r["strategy"], r["model"]) for r in rows] == [("single", "lenet"), ("single", "simple_cnn"),
                                                           ("ddp", "lenet"), ("ddp", "simple_cnn")]
    ddp_rows = [r for r in rows if "strategy=ddp" in r["overrides"]]
    assert all(len(r["per_rank_samples_per_sec"].split(" / ")) == 2 for r in ddp_rows)
    table = (sweep_dir / "summary.md").read_text()
    assert table.count("\n") == 2 + 4 and "sweep summary" in out and "| test_acc |" in table


def test_a_failing_job_does_not_stop_the_sweep_but_fails_it(tmp_path):
    proc = run_train(["-m", "strategy=single", "trainer.precision=fp32,fp16", "trainer.accelerator=cpu", *TINY,
                      "trainer.max_steps=2"], tmp_path, timeout=300)
    assert proc.returncode == 1  # the sweep ran every job; one of them was refused
    assert "trainer.precision=fp16 is not allowed on the CPU" in proc.stderr
    assert "1 sweep job(s) failed: 1" in proc.stderr
    [sweep_dir] = {j.parent for j in run_dirs(tmp_path)}
    with open(sweep_dir / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"]) for r in rows] == [("0", "ok"), ("1", "failed")]


# Tiny jobs: 2 steps of LeNet on random images, one evaluation
SEED_SWEEP = ["-m", "strategy=single", "dataset=synthetic", "dataset.train_size=128", "dataset.test_size=64",
              "trainer.batch_size=32", "trainer.max_steps=2", "trainer.log_every_n_steps=1",
              "optimizer.lr=0.1,0.001", "trainer.seed=1,2,3"]


def test_a_seed_sweep_gives_mean_and_sd_per_config_and_marks_the_best(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    out = check_ok(run_train(SEED_SWEEP, tmp_path, timeout=300))
    jobs = run_dirs(tmp_path)
    assert [j.name for j in jobs] == ["0_lr=0.1_seed=1", "1_lr=0.1_seed=2", "2_lr=0.1_seed=3",
                                      "3_lr=0.001_seed=1", "4_lr=0.001_seed=2", "5_lr=0.001_seed=3"]
    sweep_dir = jobs[0].parent
    results = {j.name: json.loads((j / "result.json").read_text()) for j in jobs}
    acc = {lr: [r["test_acc"] for name, r in results.items() if f"lr={lr}_" in name] for lr in ("0.1", "0.001")}
    best_lr = max(acc, key=lambda lr: statistics.fmean(acc[lr]))

    with open(sweep_dir / "summary_seeds.csv") as f:
        rows = {r["optimizer.lr"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"0.1", "0.001"}
    for lr, row in rows.items():
        assert (row["n"], row["failed"], row["seeds"]) == ("3", "0", "1 2 3")
        assert float(row["test_acc_mean"]) == pytest.approx(statistics.fmean(acc[lr]))
        assert float(row["test_acc_sd"]) == pytest.approx(statistics.stdev(acc[lr]))
        assert row["best"] == ("*" if lr == best_lr else "")
        assert "trainer.seed" not in row["overrides"] and f"optimizer.lr={lr}" in row["overrides"]
    table = (sweep_dir / "summary.md").read_text()
    shown = f"| {best_lr} | 3 | 0 |"
    best_line = next(line for line in table.splitlines() if line.startswith(shown))
    assert best_line.endswith("| * |") and f"{statistics.fmean(acc[best_lr]):.4f} ± " in best_line
    assert "mean ± sd" in out and best_line in out  # printed at the end too

    by_lr = {}
    for folder in sorted((sweep_dir / "seeds").iterdir()):
        events = EventAccumulator(str(folder))
        events.Reload()
        content = events.PluginTagToContent("hparams")
        session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        params = session.session_start_info.hparams
        lr = params["optimizer.lr"].number_value
        by_lr[lr] = (params["seeds"].number_value, params["best"].number_value,
                     events.Scalars("hparam/test_acc")[0].value, events.Scalars("hparam/test_acc_sd")[0].value)
    for lr, (seeds, best, mean, sd) in by_lr.items():
        key = "0.1" if lr == pytest.approx(0.1) else "0.001"
        assert (seeds, best) == (3, float(key == best_lr))
        assert mean == pytest.approx(statistics.fmean(acc[key]), abs=1e-6)
        assert sd == pytest.approx(statistics.stdev(acc[key]), abs=1e-6)

    for folder in [sweep_dir, *jobs]:  # the sweep's record and each job's
        record = json.loads((folder / "provenance.json").read_text())
        assert record["versions"]["torch"] and record["packages"]["torch"]
    assert "trainer.seed=1,2,3" in json.loads((sweep_dir / "provenance.json").read_text())["command"]["overrides"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_stopped_sweep_run_again_into_its_folder_reports_finished_jobs_and_resumes_the_stopped_one(tmp_path, sig):
    args = ["-m", "strategy=single", "dataset=synthetic", "dataset.train_size=1024", "dataset.test_size=64",
            "trainer.batch_size=32", "trainer.max_steps=8", "trainer.log_every_n_steps=1",
            "trainer.checkpoint_every_n_steps=2", "trainer.seed=1,2,3"]
    proc, err, args = stop_in_second_job(args, tmp_path, sig)
    job0, job1 = run_dirs(tmp_path)
    sweep_dir = job0.parent
    if sig == signal.SIGINT:
        assert proc.returncode == 128 + signal.SIGINT, err
        [line] = [line for line in err.splitlines() if line.startswith("To resume: ")]
        command = shlex.split(line.removeprefix("To resume: "))
        assert command[:2] == ["python", str(TRAIN)] and command[-1] == f"hydra.sweep.dir={sweep_dir.absolute()}"
        again = command[2:]
    else:  # nothing could say anything: the user names the folder
        assert proc.returncode == -signal.SIGKILL
        again = [*pin_accelerator(args), f"hydra.sweep.dir={sweep_dir}"]
    first_result = (job0 / "result.json").read_text()

    out = check_ok(run_train(again, tmp_path, env=faults_env()))
    assert f"job 0 finished before in {job0}: not trained again; its result.json says acc" in out
    assert f"resumed from {job1}/checkpoints/step-" in out
    job2 = sweep_dir / "2_seed=3"
    assert f"run folder {job2}" in out and (job0 / "result.json").read_text() == first_result
    assert sorted(losses_by_step(job1)) == list(range(1, 9))  # job 1 went on from its checkpoint to step 8
    with open(sweep_dir / "summary.csv") as f:
        assert [(r["job"], r["status"]) for r in csv.DictReader(f)] == [("0", "ok"), ("1", "ok"), ("2", "ok")]
