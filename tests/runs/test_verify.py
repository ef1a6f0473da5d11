"""verify.py as users run it: a real command that trains real train.py runs under the strategy and one process and
compares them. Equal (exit 0) for ddp on LeNet, fsdp on issue 53's LeNet command (a layout auto resolves per
strategy) and tp=2 on the char LM; equal bitwise, and said so, for ddp with trainer.invariant; not equal (exit 1)
with the cause found by experiment for a user's BatchNorm CNN (strategy.sync_batchnorm=true: equal then) and a net
with dropout (dropout 0: equal then); a step that scales its loss by the world size is none of the candidates: the
table and the first step's ratio are shown. The rounding floor is one process training the ranks' micro-batches: its
losses and weights are the ddp run's. A SIGKILLed verify.py takes its runs with it. Each command is run once per
session (support/run_cache.py), but the one verify.py killed."""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from framework.verify.compare import final_weights, weight_difference
from support.processes import (VERIFY, command_of, faults_env, gone_within, held_at, pin_accelerator, processes_tagged,
                               user_code_env, wait_until_held)
from support.run_files import losses_by_step, walk

# LeNet's default run (its schedule: 3 epochs of 64 steps) on 4,096 Fashion-MNIST images, its first 10 steps
LENET = ["dataset.max_train_samples=4096", "dataset.max_test_samples=256", "trainer.batch_size=64", "verify.steps=10"]
CHAR_LM = ["experiment=char_lm", "model.n_layer=2", "model.n_embd=32", "model.n_head=4", "dataset.block_size=32",
           "dataset.max_train_samples=1024", "dataset.max_test_samples=64", "trainer.batch_size=16",
           "trainer.stall_timeout=120", "strategy.timeout=180", "verify.steps=8"]
# issue 53's command as a user typed it: LeNet's layout resolved on in one process and off under fsdp, a ReLU flipped
ISSUE_53 = ["strategy=fsdp", "strategy.nproc_per_node=2", "dataset=synthetic", "trainer.accelerator=cpu", "model=lenet",
            "trainer.batch_size=32", "lr_schedule=constant", "verify.steps=6"]
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


def test_an_invariant_ddp_run_is_bitwise_equal_to_one_process_and_said_so(runs):
    """trainer.invariant (issue 58): 0 difference, where the plain ddp run above is equal within rounding."""
    done = verify(runs, "strategy=ddp", "trainer.invariant=true", *LENET)
    assert done.code == 0, done.stdout + done.stderr
    assert done.last_line == ("verify: equal to one process over 10 steps, bitwise: 0 difference in every step's "
                              "loss and every weight"), done.last_line
    compared = done.record["comparisons"]["as_configured"]
    assert compared["loss_gap"] == 0 and compared["weight_gap"] == 0 and done.record["workers"] == 2


@pytest.mark.parametrize("args, strategy, steps", [
    (ISSUE_53, "fsdp", 6),
    (["strategy=tp", *CHAR_LM], "tp", 8),
], ids=["fsdp_lenet_issue_53", "tp2_char_lm"])
def test_sharding_engines_are_equal_to_one_process(runs, args, strategy, steps):
    done = verify(runs, *args)
    assert_equal(done, strategy, steps)
    for run in ("single", strategy):  # the layout these engines resolve auto to is every run's (LeNet: on alone)
        assert "channels_last: false" in (done.folder / run / "resolved_config.yaml").read_text()


def test_the_floor_is_one_process_training_the_ranks_micro_batches(runs):
    """A weight tolerance no float run meets makes verify.py measure the rounding floor. It is one process training
    each step as the 2 ranks' micro-batches (trainer.deal_as_ranks=2, trainer.grad_accum=2): the ranks' samples,
    shapes and threads, so on CPU workers its losses and weights are the ddp run's to the bit (2 ranks: halving and
    a sum of two are exact). With rounding alone moving the weights past the tolerance, the weights cannot tell."""
    done = verify(runs, "strategy=ddp", *LENET, "verify.weight_tolerance=1e-12")
    assert done.code == 1, done.stdout + done.stderr
    assert done.last_line.startswith("verify: equal to one process in the loss of all 10 steps"), done.last_line
    assert ("but the weights at the end cannot tell: rounding alone moves them by" in done.last_line
            and "(one process training each step as the 2 ranks' micro-batches), more than "
                "verify.weight_tolerance=1e-12" in done.last_line), done.last_line
    record = done.record
    compared = record["comparisons"]["as_configured"]
    assert record["verdict"] == compared["verdict"] == "cannot_tell" and not record["equal"]
    floor, ddp = done.folder / "single_as_ranks", done.folder / "ddp"
    assert compared["floor"]["run"] == str(floor)
    config = (floor / "resolved_config.yaml").read_text()
    assert "deal_as_ranks: 2" in config and "grad_accum: 2" in config and "name: single" in config
    assert losses_by_step(floor) == losses_by_step(ddp), "the floor trains what the ranks train"
    assert weight_difference(final_weights(ddp), final_weights(floor))[0] == 0.0
    assert [s["rounding"] for s in compared["steps"]] == [s["relative"] for s in compared["steps"]]


def _start_verify(args: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(VERIFY), *pin_accelerator(args)], cwd=cwd, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                            stdout=(cwd / "verify.out").open("w"), stderr=(cwd / "verify.err").open("w"))


def test_a_sigkilled_verify_takes_its_runs_with_it(tmp_path):
    """A run of its own: it is killed. `kill -9` of verify.py while its ddp run trains must end that run's driver,
    its worker template and its workers within seconds, as a SIGKILLed train.py's workers end (tests/runs/
    test_signals.py): each run verify.py starts ends with it (framework/verify/tethered.py). The ddp run waits at
    step 3 (held_at), the one-process run is done."""
    tag = uuid.uuid4().hex
    args = held_at(["strategy=ddp", *LENET, "trainer.progress_bar=false"], step=3, runs="ddp")
    verify_py = _start_verify(args, tmp_path, {**faults_env(), "HYDRA_DIST_TEST_TAG": tag})
    try:
        wait_until_held(verify_py, tmp_path)
        runs = [pid for pid in processes_tagged(tag) if pid != verify_py.pid]
        assert len(runs) >= 3, "the ddp run's driver and its workers run"
        verify_py.kill()
        verify_py.wait()
        killed = time.monotonic()
        left = gone_within(tag, 15)
        assert left == [], (f"{len(left)} process(es) of verify.py's runs still there {time.monotonic() - killed:.0f} "
                            f"s after its SIGKILL: {[command_of(pid) for pid in left]}")
    finally:
        for pid in processes_tagged(tag):  # without the fix: they would train on for good
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)



def test_batchnorm_with_per_rank_statistics_is_found_and_sync_batchnorm_named(runs):
    done = verify(runs, *BATCHNORM)
    assert done.code == 1, done.stdout + done.stderr
    assert "ddp x2 differs from one process from step 1 on" in done.stdout
    assert done.last_line.startswith("verify: not equal to one process; the cause, found by experiment: BatchNorm "
                                     "with per-rank statistics (features.1)")
    assert done.last_line.endswith("with strategy.sync_batchnorm=true the gap closes: train with it")
    record = done.record
    assert record["cause"]["key"] == "sync_batchnorm" and [t["key"] for t in record["tried"]] == ["sync_batchnorm"]
    synchronized = record["comparisons"]["sync_batchnorm"]
    assert record["comparisons"]["as_configured"]["verdict"] == "not_equal" and synchronized["verdict"] != "not_equal"
    assert synchronized["steps"][0]["relative"] <= record["loss_tolerance"], "it tells at step 1, where they differed"
    experiment = (done.folder / "sync_batchnorm" / "ddp" / "resolved_config.yaml").read_text()
    assert "sync_batchnorm: true" in experiment
    assert not (done.folder / "sync_batchnorm" / "single").exists(), "the one-process run is the same: reused"


def test_with_sync_batchnorm_every_loss_agrees_and_rounding_alone_decides_the_weights(runs):
    """BatchNorm's backward amplifies rounding: one process on other kernels moves its weights by more than
    verify.weight_tolerance in 10 steps, so the weights cannot tell. Every step's loss agrees within the tolerance
    (per-rank statistics differ by 1e-3 at step 1), the weights within ten times rounding alone. The floor is the
    other kernels' run: micro-batches would change BatchNorm's statistics."""
    done = verify(runs, *BATCHNORM, "strategy.sync_batchnorm=true")
    assert done.code == 1, done.stdout + done.stderr
    assert done.last_line.startswith("verify: equal to one process in the loss of all 10 steps"), done.last_line
    assert ("but the weights at the end cannot tell: rounding alone moves them by" in done.last_line
            and "(one process again with other kernels, since BatchNorm's batch statistics would change in "
                "micro-batches)" in done.last_line), done.last_line
    record = done.record
    compared = record["comparisons"]["as_configured"]
    assert record["verdict"] == "cannot_tell" and record["tried"] == [] and compared["cannot_tell_from_step"] is None
    assert compared["floor"]["run"] == str(done.folder / "single_other_order")
    assert compared["floor"]["weight_gap"] > record["weight_tolerance"]
    assert compared["weight_gap"] <= 10 * compared["floor"]["weight_gap"]
    assert all(step["relative"] <= record["loss_tolerance"] for step in compared["steps"])


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
