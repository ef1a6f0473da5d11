"""trainer.async_checkpoint: a run killed (SIGKILL, every process of it) while a checkpoint is written behind the
loop resumes from the last whole checkpoint, never from the one in flight, and the resumed run's losses equal an
uninterrupted run's at every step. Real processes: the subject is what real ranks leave on disk when killed.
The write is held at a fixed point (tests/support/faults/sitecustomize.py, HYDRA_DIST_TEST_HOLD_IN_CHECKPOINT) until
the test has killed the run, while training goes on past it. The killed and the resumed run are this test's own
(a killed run is no shared run); the uninterrupted one is the run cache's, written with blocking saves."""
import os
import signal
import uuid

import pytest

from framework.checkpoints.store import list_checkpoints, verify
from support.processes import (check_ok, faults_env, gone_within, run_train, start_train, wait_until_held)
from support.run_files import losses_by_step, run_dirs

# 16 steps per epoch, 2 epochs; a checkpoint every 4 steps and at each epoch end; a loss point every step.
RUN = ["trainer.epochs=2", "trainer.batch_size=32", "trainer.log_every_n_steps=1", "trainer.checkpoint_every_n_steps=4",
       "dataset.max_train_samples=512", "dataset.max_test_samples=256", "optimizer=sgd", "strategy.nproc_per_node=2"]
TOTAL, HELD, WHOLE = 32, 12, 8


@pytest.mark.parametrize("strategy,held_file", [
    ("ddp", ".json.tmp"),  # rank 0: step 12's .pt renamed into place, its manifest not yet on disk
    ("fsdp", "training_state.pt.tmp"),  # rank 0: every rank's shards and DCP's metadata written, not committed
])
def test_a_run_killed_while_a_checkpoint_is_written_behind_it_resumes_from_the_last_whole_one(
        runs, tmp_path, strategy, held_file):
    args = [f"strategy={strategy}", *RUN]
    reference = runs.train(args)  # blocking saves, uninterrupted
    reference.ok()
    behind = [*args, "trainer.async_checkpoint=true"]
    tag = uuid.uuid4().hex
    env = {**faults_env(), "HYDRA_DIST_TEST_TAG": tag, "HYDRA_DIST_TEST_HOLD_IN_CHECKPOINT": f"{HELD}:0:{held_file}"}
    proc = start_train(behind, tmp_path, env, start_new_session=True)
    try:
        wait_until_held(proc, tmp_path, marker=f"held_in_checkpoint_{HELD}",
                        also=lambda: f"step {HELD + 2}/{TOTAL}" in (tmp_path / "train.out").read_text())
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert not gone_within(tag, 30), "a process of the killed run is still there"
    [run_dir] = run_dirs(tmp_path)
    folder = run_dir / "checkpoints"
    assert [c.step for c in list_checkpoints(folder)] == [4, WHOLE], "step 12 was committed while held"
    assert (folder / f"step-{HELD:08d}.pt").exists() or (folder / f"step-{HELD:08d}").is_dir()  # what it left

    out = check_ok(run_train([*behind, f"hydra.run.dir={run_dir}"], tmp_path, timeout=300))
    assert f"step-{WHOLE:08d}" in out and f"(step {WHOLE}, " in out, out
    got, expected = losses_by_step(run_dir), losses_by_step(reference.run_dir)
    assert sorted(got) == sorted(expected) == list(range(1, TOTAL + 1))
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-6), f"step {step}"
    committed = list_checkpoints(folder)
    assert committed[-1].step == TOTAL and all(verify(c) is None for c in committed)
    assert not [p.name for p in folder.glob("*.tmp")] and not (folder / f"step-{HELD:08d}.pt.tmp").exists()
