"""verify.py as users run it: a real command that trains real train.py runs under the strategy and one process and
compares them. Equal (exit 0) for ddp and fsdp on LeNet and tp=2 on the char LM; not equal (exit 1) with the cause
found by experiment for a user's BatchNorm CNN (strategy.sync_batchnorm=true: equal then) and a net with dropout
(dropout 0: equal then); a step that scales its loss by the world size is none of the candidates: the table and the
first step's ratio are shown. Each command is run once per session (support/run_cache.py)."""
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.processes import VERIFY, pin_accelerator, user_code_env
from support.run_files import losses_by_step, walk

# LeNet's default run (its schedule: 3 epochs of 64 steps) on 4,096 Fashion-MNIST images, its first 10 steps
LENET = ["dataset.max_train_samples=4096", "dataset.max_test_samples=256", "trainer.batch_size=64", "verify.steps=10"]
CHAR_LM = ["experiment=char_lm", "model.n_layer=2", "model.n_embd=32", "model.n_head=4", "dataset.block_size=32",
           "dataset.max_train_samples=1024", "dataset.max_test_samples=64", "trainer.batch_size=16",
           "trainer.stall_timeout=120", "strategy.timeout=180", "verify.steps=8"]
BATCHNORM = ["strategy=ddp", "model._target_=verify_subjects.BatchNormCNN", *LENET]
DROPOUT = ["strategy=ddp", "model._target_=verify_subjects.DropoutNet", *LENET]


@dataclass
class Verified:
    code: int
    stdout: str
    stderr: str
    folder: Path  # verify/ in the command's run folder

    @property
    def last_line(self) -> str:
        return self.stdout.strip().splitlines()[-1]

    @property
    def record(self) -> dict:
        return json.loads((self.folder / "verify.json").read_text())


def verify(runs, *args: str) -> Verified:
    run = runs.train(pin_accelerator(list(args)), command=[str(VERIFY)], env=user_code_env())
    found = walk(run.cwd, "verify.json")
    assert len(found) == 1, f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    record = found[0]
    return Verified(run.returncode, run.stdout, run.stderr, record.parent)


def assert_equal(done: Verified, strategy: str, steps: int, workers: int = 2) -> None:
    assert done.code == 0, done.stdout + done.stderr
    said = re.fullmatch(rf"verify: equal to one process over {steps} steps \(loss (\S+), weights (\S+) relative at "
                        r"most\)", done.last_line)
    assert said, done.last_line
    record = done.record
    compared = record["comparisons"]["as_configured"]
    assert record["equal"] and record["workers"] == workers and record["strategy"] == strategy
    assert said.groups() == (f"{compared['loss_gap']:.1e}", f"{compared['weight_gap']:.1e}")
    # the numbers are the runs' own: what each logged to TensorBoard, step by step
    one, other = losses_by_step(done.folder / "single"), losses_by_step(done.folder / strategy)
    assert [(s["step"], s["one_process"], s["strategy"]) for s in compared["steps"]] == [
        (step, pytest.approx(one[step], rel=1e-6), pytest.approx(other[step], rel=1e-6))
        for step in range(1, steps + 1)]
    assert one[steps] < one[1], "the runs trained"
    result = json.loads((done.folder / strategy / "result.json").read_text())
    assert result["processes"] == workers and result["steps"] == steps


@pytest.mark.core
def test_ddp_lenet_is_equal_to_one_process(runs):
    assert_equal(verify(runs, "strategy=ddp", *LENET), "ddp", 10)


@pytest.mark.parametrize("args, strategy, steps", [
    (["strategy=fsdp", *LENET], "fsdp", 10),
    (["strategy=tp", *CHAR_LM], "tp", 8),
], ids=["fsdp_lenet", "tp2_char_lm"])
def test_sharding_engines_are_equal_to_one_process(runs, args, strategy, steps):
    assert_equal(verify(runs, *args), strategy, steps)


def test_batchnorm_with_per_rank_statistics_is_found_and_sync_batchnorm_named(runs):
    done = verify(runs, *BATCHNORM)
    assert done.code == 1, done.stdout + done.stderr
    assert "ddp x2 differs from one process from step 1 on" in done.stdout
    assert done.last_line.startswith("verify: not equal to one process; the cause, found by experiment: BatchNorm "
                                     "with per-rank statistics (features.1)")
    assert done.last_line.endswith("with strategy.sync_batchnorm=true the runs are equal: train with it")
    record = done.record
    assert record["cause"]["key"] == "sync_batchnorm" and [t["key"] for t in record["tried"]] == ["sync_batchnorm"]
    assert not record["comparisons"]["as_configured"]["equal"] and record["comparisons"]["sync_batchnorm"]["equal"]
    experiment = (done.folder / "sync_batchnorm" / "ddp" / "resolved_config.yaml").read_text()
    assert "sync_batchnorm: true" in experiment
    assert not (done.folder / "sync_batchnorm" / "single").exists(), "the one-process run is the same: reused"


def test_with_sync_batchnorm_the_batchnorm_cnn_is_equal(runs):
    assert_equal(verify(runs, *BATCHNORM, "strategy.sync_batchnorm=true"), "ddp", 10)


def test_dropout_is_found_and_with_no_dropout_the_runs_are_equal(runs):
    done = verify(runs, *DROPOUT)
    assert done.code == 1, done.stdout + done.stderr
    assert "the cause, found by experiment: dropout (net.3: p=0.5): each rank draws its own masks" in done.last_line
    assert done.record["cause"]["key"] == "training_mode_draws"
    assert_equal(verify(runs, *DROPOUT, "+model.dropout=0"), "ddp", 10)


def test_a_loss_scaled_by_the_world_size_is_none_of_the_candidates(runs):
    done = verify(runs, "strategy=ddp", "step._target_=verify_subjects.WorldSizeScaledStep", *LENET)
    assert done.code == 1, done.stdout + done.stderr
    assert done.last_line.startswith("verify: not equal to one process, and none of the candidates closed the gap "
                                     "(a random draw in training mode")
    assert "2.0000 times), which is the number of workers (2)" in done.stdout
    table = [line for line in done.stdout.splitlines() if line.endswith("<- differs")]
    assert [int(line.split()[0]) for line in table] == list(range(1, 11))
    record = done.record
    assert record["cause"] is None and [t["key"] for t in record["tried"]] == ["training_mode_draws"]
    steps = record["comparisons"]["as_configured"]["steps"]
    assert steps[0]["strategy"] == pytest.approx(2 * steps[0]["one_process"], rel=1e-6)


def test_a_sweep_is_refused_in_one_line(runs):
    """-m cannot be refused in this process's Hydra (its launcher runs the job): a real command."""
    done = runs.train(pin_accelerator(["-m", "strategy=ddp,fsdp"]), command=[str(VERIFY)])
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: -m/--multirun is not allowed with verify.py: it compares one configuration with one process; run it "
        "once per configuration")
    assert not walk(done.cwd, "verify"), "no run started"
