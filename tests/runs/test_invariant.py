"""trainer.invariant as real runs (the subject is what 1, 2 and 4 real ranks compute): LeNet with augmentation and
the char LM with dropout, 20 steps each, under strategy=single and under ddp with 2 and 4 gloo workers (one sweep):
every step's logged loss, the run's train loss and the hash of the last checkpoint's weights and optimizer state are
bitwise the same. A LeNet run on 4 workers killed after the checkpoint of step 10 and resumed on 2 continues bit for
bit. The step in one process: tests/unit/test_invariant_step.py; the refusals: tests/unit/test_bad_inputs.py;
verify.py's "bitwise": tests/runs/test_verify.py."""
import json
import os
import signal
import uuid

import pytest

from framework.checkpoints.digest import state_digest
from support.processes import (check_ok, faults_env, gone_within, held_at, run_train, start_train,
                               wait_until_held)
from support.run_files import assert_resumed_from, losses_by_step, run_dirs

STEPS = 20
COMMON = ["trainer.invariant=true", "trainer.epochs=1", f"trainer.max_steps={STEPS}", "trainer.batch_size=64",
          "trainer.log_every_n_steps=1", "dataset.max_train_samples=1280"]
MODELS = {
    "lenet": ["model=lenet", "dataset.max_test_samples=128",
              "+dataset.augment._target_=framework.data.augment.RandomCropFlip"],
    "char_lm": ["experiment=char_lm", "model.n_layer=2", "model.n_embd=32", "model.n_head=4", "model.dropout=0.1",
                "dataset.block_size=32", "dataset.max_test_samples=64", "trainer.log_every_n_steps=1"],
}
WORKERS = (1, 2, 4)  # strategy=single, then ddp's sweep over strategy.nproc_per_node


def _runs(runs, model: str) -> dict:
    """Run folder by number of workers: one process, and ddp's 2 and 4 workers as one sweep."""
    args = [*COMMON, *MODELS[model]]
    found = {1: runs.train([*args, "strategy=single"]).ok().run_dir}
    sweep = runs.train(["-m", *args, "strategy=ddp", "strategy.nproc_per_node=2,4"], timeout=900).ok()
    for job in sweep.jobs:
        found[json.loads((job / "result.json").read_text())["processes"]] = job
    assert sorted(found) == list(WORKERS)
    return found


def _last_checkpoint(run_dir):
    return sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1]


@pytest.mark.parametrize("model", list(MODELS))
def test_single_and_ddp_on_2_and_4_workers_are_bitwise_equal_at_every_step(runs, model):
    found = _runs(runs, model)
    one = found[1]
    losses = losses_by_step(one)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1]
    digest = state_digest(_last_checkpoint(one))
    train_loss = json.loads((one / "result.json").read_text())["train_loss"]
    for workers in WORKERS[1:]:
        run_dir = found[workers]
        assert (run_dir / "train.log").read_text().count(f"({8 // workers} per rank)") == 1
        assert losses_by_step(run_dir) == losses, f"ddp x{workers}"
        assert json.loads((run_dir / "result.json").read_text())["train_loss"] == train_loss, f"ddp x{workers}"
        assert _last_checkpoint(run_dir).name == _last_checkpoint(one).name
        assert state_digest(_last_checkpoint(run_dir)) == digest, f"ddp x{workers}: weights or optimizer state"


def test_a_run_killed_on_4_workers_resumes_on_2_bit_for_bit(runs, tmp_path):
    """A run of its own: it is held at the end of step 11 (the checkpoint of step 10 written), SIGKILLed with every
    process of it, and resumed in its folder on 2 workers."""
    reference = _runs(runs, "lenet")[4]
    args = [*COMMON, *MODELS["lenet"], "strategy=ddp", "trainer.checkpoint_every_n_steps=10"]
    tag = uuid.uuid4().hex
    proc = start_train(held_at([*args, "strategy.nproc_per_node=4"], step=11), tmp_path,
                       {**faults_env(), "HYDRA_DIST_TEST_TAG": tag}, start_new_session=True)
    try:
        wait_until_held(proc, tmp_path)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert not gone_within(tag, 30), "a process of the killed run is still there"
    [run_dir] = run_dirs(tmp_path)
    assert [p.name for p in sorted((run_dir / "checkpoints").glob("step-*.pt"))] == ["step-00000010.pt"]

    out = check_ok(run_train([*args, "strategy.nproc_per_node=2", f"hydra.run.dir={run_dir}"], tmp_path,
                             timeout=300))
    assert_resumed_from(out, 10)
    assert losses_by_step(run_dir) == losses_by_step(reference)
    assert state_digest(_last_checkpoint(run_dir)) == state_digest(_last_checkpoint(reference))
