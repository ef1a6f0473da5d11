"""`train.py -m`: one folder per job, none from workers, and one summary table at the end."""
import csv

from conftest import TINY, check_ok, read_scalars, run_dirs, run_train


def test_sweep_makes_one_folder_per_job_and_a_summary(tmp_path):
    out = check_ok(run_train(["-m", "strategy=single,ddp", "model=lenet,simple_cnn", *TINY, "trainer.epochs=1"],
                             tmp_path, timeout=400))
    jobs = run_dirs(tmp_path)
    assert len(jobs) == 4
    assert len({j.parent for j in jobs}) == 1, "all jobs belong to one sweep folder"
    assert sorted(j.name.split("_", 1)[1] for j in jobs) == ["ddp_lenet", "ddp_simple_cnn", "single_lenet", "single_simple_cnn"]
    assert not (tmp_path / "outputs" / "runs").exists(), "no stray single-run folders"
    for job in jobs:
        assert "throughput/samples_per_sec/rank0" in read_scalars(job)

    sweep_dir = jobs[0].parent
    with open(sweep_dir / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1", "2", "3"]
    assert all(r["status"] == "ok" and 0.1 < float(r["test_acc"]) <= 1 and float(r["train_loss"]) > 0 for r in rows)
    assert {r["overrides"].split()[0] for r in rows} == {"strategy=single", "strategy=ddp"}
    ddp_rows = [r for r in rows if "strategy=ddp" in r["overrides"]]
    assert all(len(r["per_rank_samples_per_sec"].split(" / ")) == 2 for r in ddp_rows)
    table = (sweep_dir / "summary.md").read_text()
    assert table.count("\n") == 2 + 4 and "sweep summary" in out and "| test_acc |" in table


def test_a_failing_job_does_not_stop_the_sweep_but_fails_it(tmp_path):
    proc = run_train(["-m", "strategy=single", "trainer.precision=fp32,fp16", "trainer.accelerator=cpu", *TINY,
                      "trainer.max_steps=2"], tmp_path, timeout=300)
    assert proc.returncode != 0
    assert "trainer.precision=fp16 is not allowed on the CPU" in proc.stderr
    assert "1 sweep job(s) failed: 1" in proc.stderr
    [sweep_dir] = {j.parent for j in run_dirs(tmp_path)}
    with open(sweep_dir / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"]) for r in rows] == [("0", "ok"), ("1", "failed")]
