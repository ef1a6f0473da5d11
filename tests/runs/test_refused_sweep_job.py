"""A sweep with a job its driver refuses, as a user runs it (`-m experiment=compare_strategies strategy=single,tp`:
LeNet has no tensor-parallel plan): the reason is kept in the job's train.log and in the sweep's summary beside the
job that trained; that job's folder, named by the sweep with an '=' (0_strategy=single), goes to eval.py as
ckpt_path unquoted. The quoting and the summary's row, in this process: tests/unit/test_path_overrides.py and
tests/unit/test_sweep.py."""
import csv
import json

import pytest

from support.driver import command_in_process
from support.processes import TINY

SWEEP = ["-m", "experiment=compare_strategies", "strategy=single,tp", *TINY, "trainer.max_steps=2"]
REASON = "strategy.tp=2 is not allowed for LeNet: it has no tensor_parallel_plan"


@pytest.fixture(scope="module")
def sweep(runs):
    run = runs.train(SWEEP)
    assert run.returncode == 1, run.stderr  # every job ran, and one was refused
    return run


def test_a_refused_jobs_reason_is_kept_in_its_train_log_and_the_summary(sweep):
    trained, refused = sweep.jobs
    assert (trained.name, refused.name) == ("0_strategy=single", "1_strategy=tp")
    assert f"error: {REASON}" in sweep.stderr
    assert f"error: {REASON}" in (refused / "train.log").read_text()
    with open(trained.parent / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"]) for r in rows] == [("0", "ok"), ("1", "failed")]
    assert rows[0]["error"] == "" and rows[1]["error"].startswith(REASON)
    assert REASON in (trained.parent / "summary.md").read_text()


def test_eval_py_takes_the_job_folder_the_sweep_named_unquoted(sweep, tmp_path, monkeypatch, capsys):
    trained = sweep.jobs[0]
    code, out, err = command_in_process("eval_main", ["eval.py", f"ckpt_path={trained}", "strategy=single"], tmp_path,
                                        monkeypatch, capsys)
    assert code == 0, err
    [evaluated] = (tmp_path / "outputs" / "evals").glob("*/eval.json")
    said = json.loads(evaluated.read_text())
    assert said["ckpt_path"] == str(trained)
    assert said["test_acc"] == json.loads((trained / "result.json").read_text())["test_acc"]
