"""Ctrl-C and SIGTERM (preemption): all workers stop within seconds, no process is left behind, the last
complete checkpoint stays valid, the exit code is non-zero and the message says how to resume."""
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import REPO, TRAIN, check_ok, pin_accelerator, processes_tagged, run_train
from framework.checkpoints.store import newest_valid

EXAMPLE = REPO / "examples" / "my_project"
RUN = ["trainer.max_steps=400", "trainer.batch_size=32", "trainer.log_every_n_steps=1",
       "trainer.checkpoint_every_n_steps=4", "dataset.max_train_samples=512", "dataset.max_test_samples=128"]


def _start_and_signal(cwd: Path, args: list[str], sig: int, after_step: int = 6, then_wait: float = 0.0,
                      env: dict | None = None):
    tag = uuid.uuid4().hex
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_DIST_TEST_TAG": tag, **(env or {})}
    proc = subprocess.Popen([sys.executable, str(TRAIN), *pin_accelerator(args)], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if f" step {after_step}/" in line:
            break
    time.sleep(then_wait)
    sent = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    stopped_after = time.monotonic() - sent
    deadline = time.monotonic() + 10
    while processes_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    return proc.returncode, "".join(seen) + out, err, stopped_after, processes_tagged(tag)


def _resume_command(err: str) -> list[str]:
    [line] = [l for l in err.splitlines() if l.startswith("To resume: ")]
    words = shlex.split(line.removeprefix("To resume: "))
    assert words[:2] == ["python", "train.py"] and "trainer.resume=auto" in words
    return words[2:]


@pytest.mark.parametrize("strategy,sig", [("single", signal.SIGTERM), ("ddp", signal.SIGTERM), ("ddp", signal.SIGINT)])
def test_signal_stops_everything_and_the_run_resumes(tmp_path, strategy, sig):
    code, out, err, seconds, left = _start_and_signal(tmp_path, [f"strategy={strategy}", *RUN], sig)
    assert code == 128 + sig, err
    assert seconds < 15, f"took {seconds:.1f} s to stop"
    assert left == [], f"processes left behind: {left}"
    name = signal.Signals(sig).name
    assert f"stopped by {name}; all workers are stopped" in err
    assert "Traceback" not in err

    [run_dir] = [p.parent for p in (tmp_path / "outputs").rglob(".hydra")]
    checkpoint = newest_valid(run_dir / "checkpoints", warn=print)
    assert checkpoint is not None and checkpoint.step >= 4
    assert f"the last complete checkpoint is {checkpoint.path}" in err
    if strategy == "single":  # in-process: the signal is honoured at the next step boundary, with a checkpoint
        assert checkpoint.step >= 6

    resumed = check_ok(run_train(_resume_command(err), tmp_path))
    assert f"resumed from {checkpoint.path}" in resumed
    assert "done: test accuracy" in resumed


def test_ctrl_c_ends_workers_blocked_in_collectives_within_seconds(tmp_path):
    """Rank 0 enters a barrier at step 5 that rank 1 never calls; rank 1 goes on into step 6's gradient all-reduce.
    Both main threads sit in gloo, where Python cannot raise KeyboardInterrupt: the workers still end within
    seconds of Ctrl-C (framework/session/exit.py), not at the agent's SIGKILL 30 s later."""
    user_code = os.pathsep.join(filter(None, [str(REPO / "tests" / "user_code"), str(EXAMPLE),
                                              os.environ.get("PYTHONPATH")]))
    args = ["--config-dir", str(EXAMPLE / "conf"), "strategy=ddp", "dataset=blobs", "model=mlp",
            "trainer.batch_size=32", "trainer.epochs=50", "trainer.log_every_n_steps=1", "trainer.stall_timeout=null",
            "+callbacks.barrier._target_=stalling.BarrierOnOneRank", "+callbacks.barrier.step=5",
            "+callbacks.barrier.rank=0"]
    code, out, err, seconds, left = _start_and_signal(tmp_path, args, signal.SIGINT, after_step=4, then_wait=2.0,
                                                      env={"PYTHONPATH": user_code})
    assert code == 128 + signal.SIGINT, err
    assert " step 6/" not in out, "rank 0 was to wait in its barrier"
    assert seconds < 15, f"took {seconds:.1f} s to stop"
    assert left == [], f"processes left behind: {left}"
    assert "stopped by SIGINT; all workers are stopped" in err and "Traceback" not in err, err
    assert f"To resume: python train.py --config-dir {EXAMPLE / 'conf'} strategy=ddp" in err, "the project's own configs"
