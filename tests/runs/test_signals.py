"""Ctrl-C and SIGTERM (preemption): all workers stop within seconds, no process is left behind, the last
complete checkpoint stays valid, the exit code is non-zero and the message says how to resume; a stop while a
checkpoint is written leaves nothing of it. A SIGKILLed driver leaves no process behind either."""
import contextlib
import os
import shlex
import signal
import time
import uuid
from pathlib import Path

import pytest

from framework.checkpoints.store import newest_valid
from support.processes import (
    REPO,
    check_ok,
    command_of,
    faults_env,
    gone_within,
    held_at,
    processes_tagged,
    run_train,
    start_train,
    user_code_env,
    wait_until_held,
)
from support.run_files import assert_continues, assert_resumed_from, run_dirs

EXAMPLE = REPO / "examples" / "my_project"
RUN = ["trainer.max_steps=16", "trainer.batch_size=32", "trainer.log_every_n_steps=1",  # waits at step 6: held_at
       "trainer.checkpoint_every_n_steps=4", "dataset.max_train_samples=512", "dataset.max_test_samples=128"]


def _start_and_signal(cwd: Path, args: list[str], sig: int, env: dict | None = None,
                      marker: str = "held_at_step_*", count: int = 1, **popen):
    """Start the run, wait until it reached its point (count files named `marker`: HoldAt's by default, held_at), send
    sig. Returns the exit code, output, stderr, the seconds the run took to end and the processes it left."""
    tag = uuid.uuid4().hex
    proc = start_train(args, cwd, {**faults_env(env), "HYDRA_DIST_TEST_TAG": tag}, **popen)
    wait_until_held(proc, cwd, count=count, marker=marker)
    sent = time.monotonic()
    proc.send_signal(sig)
    proc.wait(timeout=60)
    stopped_after = time.monotonic() - sent
    gone_within(tag, 10)
    out, err = (cwd / "train.out").read_text(), (cwd / "train.err").read_text()
    return proc.returncode, out, err, stopped_after, processes_tagged(tag)


def _resume_command(err: str) -> list[str]:
    [line] = [l for l in err.splitlines() if l.startswith("To resume: ")]
    words = shlex.split(line.removeprefix("To resume: "))
    assert words[:2] == ["python", "train.py"] and "trainer.resume=auto" in words
    return words[2:]


@pytest.mark.parametrize("strategy,sig", [("single", signal.SIGTERM), ("ddp", signal.SIGTERM), ("ddp", signal.SIGINT)])
def test_signal_stops_everything_and_the_run_resumes(tmp_path, strategy, sig):
    # the run waits at the end of step 6 (tests/support/faults/hold.py) until the signal comes
    code, out, err, seconds, left = _start_and_signal(tmp_path, held_at([f"strategy={strategy}", *RUN], step=6), sig)
    assert code == 128 + sig, err
    assert seconds < 15, f"took {seconds:.1f} s to stop"
    assert left == [], f"processes left behind: {left}"
    name = signal.Signals(sig).name
    assert f"stopped by {name}; all workers are stopped" in err
    assert "Traceback" not in err

    [run_dir] = run_dirs(tmp_path)
    checkpoint = newest_valid(run_dir / "checkpoints", warn=print)
    assert checkpoint is not None and checkpoint.step >= 4
    assert f"the last complete checkpoint is {checkpoint.path}" in err
    if strategy == "single":  # in-process: the signal is honoured at the next step boundary, with a checkpoint
        assert checkpoint.step >= 6

    command = _resume_command(err)
    if sig == signal.SIGINT:  # the same stop and resume command as SIGTERM's: resumed once per strategy is enough
        return
    resumed = check_ok(run_train(command, tmp_path, env=faults_env()))
    assert f"resumed from {checkpoint.path}" in resumed
    assert "done: test accuracy" in resumed


@pytest.mark.parametrize("strategy,sig,held_file,kept", [
    # rank 0 with step 8's bytes in its temporary file, not yet renamed
    ("ddp", signal.SIGTERM, ".pt.tmp", "step-00000004.pt"),
    # rank 0 between step 8's renamed .pt and its manifest
    ("ddp", signal.SIGINT, ".json.tmp", "step-00000004.pt"),
    # every rank's shards of step 8 written, rank 0 committing them
    ("fsdp", signal.SIGTERM, "training_state.pt.tmp", "step-00000004"),
])
def test_a_stop_while_a_checkpoint_is_written_leaves_nothing_of_it_and_resumes_onto_the_uninterrupted_losses(
        runs, tmp_path, strategy, sig, held_file, kept):
    """A run of its own (signalled while rank 0 is held in the write of step 8's checkpoint: tests/support/faults/
    sitecustomize.py). A worker ended by SIGTERM vanished there, leaving step-00000008.pt.tmp or the shard folder:
    it unwinds now."""
    args = [f"strategy={strategy}", *RUN]
    reference = runs.train(args).ok().run_dir  # uninterrupted
    code, out, err, seconds, left = _start_and_signal(
        tmp_path, args, sig, env={"HYDRA_DIST_TEST_HOLD_IN_CHECKPOINT": f"8:0:{held_file}"},
        marker="held_in_checkpoint_8")
    assert code == 128 + sig, err
    assert left == [], f"processes left behind: {left}"
    assert f"stopped by {signal.Signals(sig).name}; all workers are stopped" in err and "Traceback" not in err, err
    [run_dir] = run_dirs(tmp_path)
    folder = run_dir / "checkpoints"
    assert f"the last complete checkpoint is {folder / kept}" in err, err
    assert sorted(p.name for p in folder.iterdir()) == sorted([kept, "step-00000004.json"]), "a part of step 8's"

    resumed = check_ok(run_train(_resume_command(err), tmp_path, env=faults_env()))
    assert_resumed_from(resumed, 4)
    assert_continues(reference, run_dir, 16, resumed_from=4)


def test_sigint_stops_workers_whose_driver_was_started_ignoring_it(tmp_path):
    """A script's `python train.py ... &` (a shell without job control) starts the driver with SIGINT ignored, and its
    workers inherited that through the worker template: the agent's stop (it passes SIGINT on) reached workers that
    trained on until its SIGKILL 30 s later. They take SIGINT as Ctrl-C again."""
    code, out, err, seconds, left = _start_and_signal(
        tmp_path, held_at(["strategy=ddp", *RUN], step=6), signal.SIGINT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert code == 128 + signal.SIGINT, err
    assert seconds < 15, f"took {seconds:.1f} s to stop"
    assert left == [], f"processes left behind: {left}"
    assert "stopped by SIGINT; all workers are stopped" in err and "Traceback" not in err, err


def test_ctrl_c_ends_workers_blocked_in_collectives_within_seconds(tmp_path):
    """Rank 0 enters a barrier at step 5 that rank 1 never calls; rank 1 goes on into step 6's gradient all-reduce.
    Both main threads sit in gloo, where Python cannot raise KeyboardInterrupt: the workers still end within
    seconds of Ctrl-C (framework/session/exit.py), not at the agent's SIGKILL 30 s later. Ctrl-C comes once both
    ranks are past step 5 (the callback's files say so)."""
    user_code = user_code_env(EXAMPLE)["PYTHONPATH"]
    args = ["--config-dir", str(EXAMPLE / "conf"), "strategy=ddp", "dataset=blobs", "model=mlp",
            "trainer.batch_size=32", "trainer.epochs=50", "trainer.log_every_n_steps=1", "trainer.stall_timeout=null",
            "+callbacks.barrier._target_=stalling.BarrierOnOneRank", "+callbacks.barrier.step=5",
            "+callbacks.barrier.rank=0"]
    code, out, err, seconds, left = _start_and_signal(tmp_path, args, signal.SIGINT, env={"PYTHONPATH": user_code},
                                                      marker="at_step_5_rank*", count=2)
    assert code == 128 + signal.SIGINT, err
    assert " step 6/" not in out, "rank 0 was to wait in its barrier"
    assert seconds < 15, f"took {seconds:.1f} s to stop"
    assert left == [], f"processes left behind: {left}"
    assert "stopped by SIGINT; all workers are stopped" in err and "Traceback" not in err, err
    assert f"To resume: python train.py --config-dir {EXAMPLE / 'conf'} strategy=ddp" in err, "the project's own configs"


@pytest.mark.parametrize("strategy", ["ddp", "horovod"])
def test_workers_end_within_seconds_of_a_sigkilled_driver(tmp_path, strategy):
    """A terminal or a scheduler may SIGKILL the driver, which then stops nothing: its workers, the worker template
    they were forked from and multiprocessing's resource tracker must still end within seconds, not train on into
    the run folder (and hold the GPUs). The run is far from its end when the driver dies (held at step 3 of 16). ddp's
    launch is fsdp's and deepspeed's (torch's elastic agent, framework/launch/elastic.py); horovod's runner has its
    own (horovod/runner/common/util/safe_shell_exec.py: a middleman per worker ends it when the driver is gone)."""
    if strategy == "horovod":
        pytest.importorskip("horovod.torch")
    tag = uuid.uuid4().hex
    args = held_at([f"strategy={strategy}", *RUN, "dataset=synthetic", "trainer.progress_bar=false"], step=3)
    driver = start_train(args, tmp_path, {**faults_env(), "HYDRA_DIST_TEST_TAG": tag})
    try:
        wait_until_held(driver, tmp_path)  # rank 0 waits at step 3, the other ranks in its next collective
        workers = [pid for pid in processes_tagged(tag) if pid != driver.pid]
        assert len(workers) >= 2, "the workers (and the template) run"
        driver.kill()
        driver.wait()  # reaped, so that the tag search does not find it
        killed = time.monotonic()
        left = gone_within(tag, 15)
        assert left == [], f"{len(left)} process(es) of the run still there {time.monotonic() - killed:.0f} s after " \
                           f"the driver's SIGKILL: {[command_of(pid) for pid in left]}"
    finally:
        for pid in processes_tagged(tag):  # without the fix: they would train on for good
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

