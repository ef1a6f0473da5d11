"""`horovodrun -np 2 -H localhost:2 python train.py strategy=horovod`, as Horovod users start every script: the
workers horovodrun started are used, rank 0 runs Hydra (one run folder), every rank's throughput reaches
TensorBoard, a bad value ends every rank with one message, Ctrl-C leaves no process. Each test starts horovodrun:
the launch is its subject (which strategies fit horovodrun's workers, in-process: tests/unit/test_launchers.py)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from support.processes import (
    REPO,
    TINY,
    TRAIN,
    check_ok,
    faults_env,
    gone_within,
    held_at,
    pin_accelerator,
    run_train,
    wait_until_held,
)
from support.run_files import read_scalars, run_dirs, walk

pytest.importorskip("horovod.torch")
HOROVODRUN = [str(Path(sys.executable).with_name("horovodrun")), "--gloo", "-np", "2", "-H", "localhost:2",
              sys.executable]
OUR_TRACEBACK = f'File "{REPO / "framework"}'  # a traceback line in one of our files


@pytest.mark.core
def test_horovodrun_trains_with_its_workers_in_one_run_folder(tmp_path):
    out = check_ok(run_train(["strategy=horovod", *TINY, "trainer.epochs=1"], tmp_path, launcher=HOROVODRUN,
                             timeout=300))
    assert out.count("done: test accuracy") == 1
    [run_dir] = run_dirs(tmp_path)  # the other rank never ran Hydra: no second folder
    result = json.loads((run_dir / "result.json").read_text())
    assert result["strategy"] == "horovod" and result["processes"] == 2
    scalars = read_scalars(run_dir)
    for r in (0, 1):
        assert scalars[f"throughput/samples_per_sec/rank{r}"][-1][1] > 0
    steps = [step for step, _ in scalars["loss/train"]]
    assert steps == sorted(set(steps)) and steps[-1] == result["steps"]


@pytest.mark.parametrize("args,message", [
    (["strategy=horovod", "trainer.batch_size=0"], "trainer.batch_size=0 is not allowed: expected an integer >= 1"),
    (["strategy=horovod", "strategy.np=3"], "strategy.np=3 is not allowed under horovodrun, which started 2 workers"),
])
def test_a_bad_value_under_horovodrun_ends_every_rank_with_one_message(tmp_path, args, message):
    started = time.monotonic()
    proc = run_train(args, tmp_path, launcher=HOROVODRUN, timeout=180)
    output = proc.stdout + proc.stderr
    # horovodrun's own code for a failed job; the first rank to end ended with a refusal's
    assert proc.returncode == 1 and re.search(r"Exit code: (-?\d+)", output).group(1) == "2", output
    assert message in output, output
    assert time.monotonic() - started < 90, "a rank waited for the others instead of ending"
    # horovodrun prints its own RuntimeError when a worker exits non-zero (as torchrun does); ours print none
    assert OUR_TRACEBACK not in output, output
    assert not walk(tmp_path, "checkpoints") and not walk(tmp_path, "events.out.tfevents*")


def test_ctrl_c_under_horovodrun_leaves_no_process(tmp_path):
    tag = uuid.uuid4().hex
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_DIST_TEST_TAG": tag, **faults_env()}
    args = held_at(["strategy=horovod", "trainer.max_steps=400", "trainer.batch_size=32", "trainer.log_every_n_steps=1",
                    "dataset.max_train_samples=1024", "dataset.max_test_samples=128"], step=6)
    # a terminal's Ctrl-C reaches the whole foreground process group: horovodrun and every worker
    with open(tmp_path / "train.out", "w") as log:
        proc = subprocess.Popen([*HOROVODRUN, str(TRAIN), *pin_accelerator(args)], cwd=tmp_path, env=env, text=True,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_until_held(proc, tmp_path)  # rank 0 waits at the end of step 6 (tests/support/faults/hold.py)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    out = (tmp_path / "train.out").read_text()
    assert gone_within(tag, 15) == [], out
    # Not asserted: horovodrun's own exit code, which races. Its middleman process reaps the worker's shell from two
    # threads (horovod/runner/common/util/safe_shell_exec.py: psutil's wait in terminate_executor_shell_and_children
    # and the main thread's Popen.wait); the loser gets ECHILD, which Popen reads as exit code 0 (seen in CI once).
    # python train.py strategy=horovod, which runs horovod's runner itself, reports the stop whatever it returns.
    assert "done: test accuracy" not in out and not re.search(r"step ([7-9]|\d\d+)/", out), out  # stopped where held
    assert OUR_TRACEBACK not in out, out  # horovodrun stops the workers with SIGTERM
