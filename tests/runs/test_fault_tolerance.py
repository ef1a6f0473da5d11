"""Never lose a run: resume gives the same losses, dead workers are restarted from the last checkpoint,
NaN stops cleanly. Faults are real: a callback of the tests' (tests/support/faults/fault_injection.py) makes a worker SIGKILL
itself at a named point
(framework/callbacks/faults.py), tests/support/faults/ kills one halfway through a checkpoint; only the first attempt is hit."""
import json
import re
import uuid

import pytest
import torch

from framework.checkpoints.store import list_checkpoints
from support.processes import check_ok, gone_within, kill_in_checkpoint, run_train
from support.run_files import losses_by_step, run_dirs

# 16 steps per epoch, 2 epochs; a checkpoint every 4 steps and at each epoch end; a loss point every step.
RUN = ["trainer.epochs=2", "trainer.batch_size=32", "trainer.log_every_n_steps=1", "trainer.checkpoint_every_n_steps=4",
       "dataset.max_train_samples=512", "dataset.max_test_samples=256", "optimizer=sgd"]
TOTAL = 32


def _only_run(tmp_path):
    [run_dir] = run_dirs(tmp_path)
    return run_dir, json.loads((run_dir / "result.json").read_text())


def test_resumed_run_gives_the_same_losses_as_an_uninterrupted_one(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    check_ok(run_train(["strategy=single", *RUN], tmp_path / "a"))
    reference, _ = _only_run(tmp_path / "a")

    killed = run_train(["strategy=single", *RUN], tmp_path / "b", faults="kill_after_step:10:0")
    assert killed.returncode == -9
    [run_dir] = run_dirs(tmp_path / "b")
    out = check_ok(run_train(["strategy=single", *RUN, f"hydra.run.dir={run_dir}"], tmp_path / "b"))
    assert "resumed from" in out and "step-00000008.pt (step 8" in out
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_from_step"] == 8 and result["steps"] == TOTAL

    expected, got = losses_by_step(reference), losses_by_step(run_dir)
    assert sorted(got) == list(range(1, TOTAL + 1)) == sorted(expected)
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-6), f"step {step}"


@pytest.mark.parametrize("fault,resumed_from", [
    ("kill_after_step:10:1", 8),     # (a) a worker dies between training steps
    ("kill_in_checkpoint:12:0", 8),  # (b) rank 0 dies halfway through writing the step-12 checkpoint
    ("kill_in_eval:16:1", 16),       # (c) a worker dies during the evaluation after epoch 1
])
def test_ddp_worker_death_restarts_the_group_from_the_last_checkpoint(tmp_path, fault, resumed_from):
    point, step, rank = fault.split(":")
    in_checkpoint = point == "kill_in_checkpoint"
    # log_all_ranks: the fault may fire on rank 1, whose output is otherwise kept off the console
    out = check_ok(run_train(["strategy=ddp", "strategy.nproc_per_node=2", "strategy.max_restarts=1",
                              "trainer.log_all_ranks=true", *RUN], tmp_path, timeout=300,
                             env=kill_in_checkpoint(int(step), int(rank)) if in_checkpoint else None,
                             faults=None if in_checkpoint else fault))
    assert "fault injection: SIGKILL" in out
    run_dir, result = _only_run(tmp_path)
    assert f"(step {resumed_from}, " in out
    assert result["steps"] == TOTAL and result["resumed_from_step"] == resumed_from
    assert sorted(losses_by_step(run_dir)) == list(range(1, TOTAL + 1)), "no gap in the loss curve"
    assert not list((run_dir / "checkpoints").glob("*.tmp")) or fault.startswith("kill_in_checkpoint")
    final = torch.load(result["checkpoint"], weights_only=True)
    assert final["position"]["step"] == TOTAL and "model" in final


def test_a_killed_ddp_worker_is_named_and_the_other_ended_with_nothing_left(tmp_path):
    """A run of its own (its processes are found by a tag of its own). No restarts: rank 1 SIGKILLed after step 6;
    the driver says which rank died and how, in one line, ends rank 0 (waiting for rank 1 in the next step's
    all-reduce) and leaves no process."""
    tag = uuid.uuid4().hex
    proc = run_train(["strategy=ddp", "strategy.nproc_per_node=2", *RUN], tmp_path, faults="kill_after_step:6:1",
                     env={"HYDRA_DIST_TEST_TAG": tag})
    assert proc.returncode == 1, proc.stderr
    assert re.search(r"^error: worker rank 1 failed \(exit code -9\): Signal 9 \(SIGKILL\) received by PID \d+$",
                     proc.stderr, re.M), proc.stderr
    assert proc.stderr.count("error: ") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "done: test accuracy" not in proc.stdout
    assert gone_within(tag, 10) == [], "a worker outlived the run"
    [run_dir] = run_dirs(tmp_path)
    assert [c.step for c in list_checkpoints(run_dir / "checkpoints")] == [4]


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    proc = run_train(["strategy=ddp", "strategy.nproc_per_node=2", *RUN], tmp_path,
                     faults="nan_loss:6:1")
    assert proc.returncode != 0
    assert "the training loss became NaN/inf at step 6 on rank 1" in proc.stderr
    assert "step-00000004.pt" in proc.stderr
    [run_dir] = run_dirs(tmp_path)
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt"))
    assert saved == ["step-00000004.pt"]
    state = torch.load(run_dir / "checkpoints" / saved[0], weights_only=True)
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def test_a_run_that_skips_step_after_step_stops_with_one_line(runs):
    """trainer.on_nonfinite=skip with steps 3-5 NaN and a bound of 3: the run stops at step 5, not as if it trained."""
    run = runs.train(["strategy=single", *RUN, "trainer.on_nonfinite=skip", "trainer.max_consecutive_skips=3"],
                     faults="nan_loss:3:0,nan_loss:4:0,nan_loss:5:0")
    assert run.returncode != 0
    assert ("3 optimizer steps in a row (steps 3 to 5) were skipped for a non-finite loss or gradient "
            "(trainer.max_consecutive_skips=3): the run is not training; stopped; the last good checkpoint is ") \
        in run.stderr


def test_nan_loss_can_skip_the_step_instead(tmp_path):
    out = check_ok(run_train(["strategy=single", *RUN, "trainer.on_nonfinite=skip"], tmp_path,
                             faults="nan_loss:6:0"))
    assert "step 6: non-finite loss or gradient, step skipped" in out
    run_dir, result = _only_run(tmp_path)
    assert result["skipped_steps"] == 1 and result["test_acc"] > 0.3
    losses = losses_by_step(run_dir)
    assert all(v == v for v in losses.values()), "no NaN reached the logs"
