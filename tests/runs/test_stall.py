"""A stalled rank is found and named (trainer.stall_timeout, framework/telemetry/stall.py): real ddp runs on 2 gloo
workers whose user code blocks on one rank (tests/support/user_code/stalling.py), started by us and by torchrun. The run
ends with one summary naming the rank and the user's line, every rank's stack in <run>/stall/, the last checkpoint
loadable, exit != 0 and no process left. A rank whose forward is slow but busy (tests/support/user_code/busy_model.py)
is called slow, with its speed, and the run goes on to its end."""
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from support.processes import (REPO, TRAIN, USER_CODE, gone_within, pin_accelerator, processes_tagged, torchrun,
                               user_code_env)
from support.run_files import run_dirs

EXAMPLE = REPO / "examples" / "my_project"
STALL_TIMEOUT = 8
TORCHRUN = torchrun()
# Blobs of 512 samples, 16 per rank and step: rank 1's 300th read is in step 19; checkpoints at steps 8 and 16
RUN = ["dataset=blobs", "model=mlp", "trainer.batch_size=32",
       "trainer.epochs=50", "trainer.log_every_n_steps=4", "trainer.checkpoint_every_n_steps=8",
       f"trainer.stall_timeout={STALL_TIMEOUT}", "dataset.in_memory=false"]
STALLING_DATA = ["dataset.train._target_=stalling.StallingBlobs", "+dataset.train.after=300"]


def _run(cwd: Path, args: list[str], launcher: list[str] | None = None) -> tuple[subprocess.CompletedProcess, float,
                                                                                     list[int]]:
    tag = uuid.uuid4().hex
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_DIST_TEST_TAG": tag,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(USER_CODE), str(EXAMPLE), os.environ.get("PYTHONPATH")]))}
    start = time.monotonic()
    proc = subprocess.run([*(launcher or [sys.executable]), str(TRAIN), "--config-dir", str(EXAMPLE / "conf"),
                           *pin_accelerator(args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    seconds = time.monotonic() - start
    gone_within(tag, 10)
    return proc, seconds, processes_tagged(tag)


def _check_stall_named(proc, left, run_dir: Path, stalled: int, frame: str, waiting: int,
                       launcher_traceback: bool = False) -> str:
    out, err = proc.stdout, proc.stderr
    assert proc.returncode != 0, out + err
    assert not left, f"processes left behind: {left}"
    text = out + err
    # torchrun itself ends with its ChildFailedError traceback and failure table; no worker prints one
    assert err.count("Traceback") == (1 if launcher_traceback else 0), err
    assert not launcher_traceback or "torch.distributed.elastic.multiprocessing.errors.ChildFailedError" in err
    assert text.count("the run stalled: no progress for trainer.stall_timeout=") == 1, text
    summary = text[text.index("the run stalled"):]
    assert re.search(rf"rank {stalled} did not reach the step the others wait in", summary), summary
    assert re.search(rf"^  rank {stalled} \(.*\) at step \d+, .*{frame}", summary, re.M), summary
    assert re.search(rf"^  waiting: rank {waiting} \(.*\) at step \d+", summary, re.M), summary
    for rank in (0, 1):
        stack = (run_dir / "stall" / f"rank{rank}.txt").read_text()
        assert stack.startswith(f"rank {rank} on ") and "thread MainThread" in stack
    return summary


def _check_last_checkpoint_loads(run_dir: Path, summary: str) -> None:
    from framework.checkpoints.store import load_checkpoint, newest_valid

    checkpoint = newest_valid(run_dir / "checkpoints")
    assert checkpoint is not None and checkpoint.step >= 8
    assert f"the last checkpoint is {checkpoint.path}" in summary, summary
    assert "model" in load_checkpoint(checkpoint)


def test_a_dataset_stuck_on_rank_1_is_named_with_the_users_line_and_the_run_ends(tmp_path):
    proc, seconds, left = _run(tmp_path, ["strategy=ddp", *RUN, *STALLING_DATA])
    [run_dir] = run_dirs(tmp_path)
    summary = _check_stall_named(proc, left, run_dir, 1, r"stalling\.py:\d+ in __getitem__", 0)
    assert "fetching its batch" in summary
    # the watchdog looked before it ended the run: rank 1 waits (asleep in the read), it does not compute
    assert re.search(r"stalling\.py:\d+ in __getitem__; waiting: \d+% CPU, runnable at \d+ of \d+ looks",
                     summary), summary
    assert "stalling.py" in (run_dir / "stall" / "rank1.txt").read_text()
    assert re.search(r"waiting for rank 1 for \d+ s \(at step \d+, fetching its batch", proc.stdout), proc.stdout
    _check_last_checkpoint_loads(run_dir, summary)
    log = (run_dir / "train.log").read_text()
    stalled_at = (run_dir / "stall" / "summary.txt").stat().st_mtime
    last_step = max(int(s) for s in re.findall(r"step (\d+)/", log))
    assert last_step >= 16
    # named within stall_timeout + 30 s of the stall: the whole run, start-up included, took less than that plus 60 s
    assert seconds < STALL_TIMEOUT + 30 + 60, seconds
    assert stalled_at <= time.time()


@pytest.mark.parametrize("strategy", ["deepspeed", "horovod"])
def test_the_same_stall_under_deepspeed_and_horovod_is_named(tmp_path, strategy):
    proc, _, left = _run(tmp_path, [f"strategy={strategy}", *RUN, *STALLING_DATA])
    [run_dir] = run_dirs(tmp_path)
    assert proc.returncode != 0 and not left, (proc.stdout + proc.stderr, left)
    text = proc.stdout + proc.stderr
    assert text.count("the run stalled: no progress for trainer.stall_timeout=") == 1, text
    assert re.search(r"rank 1 did not reach the step the others wait in:\n  rank 1 .* at step \d+, fetching its batch "
                     r"from the data loader: .*stalling\.py:\d+ in __getitem__", text), text
    assert (run_dir / "stall" / "rank0.txt").exists() and (run_dir / "stall" / "rank1.txt").exists()


def test_the_same_stall_under_torchrun_is_said_once(tmp_path):
    proc, _, left = _run(tmp_path, ["strategy=ddp", *RUN, *STALLING_DATA], launcher=TORCHRUN)
    [run_dir] = run_dirs(tmp_path)
    summary = _check_stall_named(proc, left, run_dir, 1, r"stalling\.py:\d+ in __getitem__", 0,
                                 launcher_traceback=True)
    _check_last_checkpoint_loads(run_dir, summary)


def test_a_rank_in_a_collective_the_others_skip_is_named_with_its_line(tmp_path):
    proc, _, left = _run(tmp_path, ["strategy=ddp", *RUN, "+callbacks.barrier._target_=stalling.BarrierOnOneRank",
                                    "+callbacks.barrier.step=5", "+callbacks.barrier.rank=0"])
    [run_dir] = run_dirs(tmp_path)
    summary = _check_stall_named(proc, left, run_dir, 0, r"stalling\.py:\d+ in on_train_step_end", 1)
    assert "at step 5, ending the step" in summary, summary
    assert re.search(r"on_train_step_end; waiting: .*, inside torch\.distributed's barrier", summary), summary


# Rank 1's every forward spins on the CPU for 3 s (busy_model.py), longer than the 2 s timeout; 2
# training steps of 16 samples per rank, then one evaluation batch of 128 on each rank. Rank 0 waits for it inside
# the gradient all-reduce and the evaluation's gather: waiting, but for a rank that computes.
BUSY_S, SLOW_TIMEOUT = 3, 2
SLOW_RUN = ["--config-dir", str(EXAMPLE / "conf"), "strategy=ddp", "dataset=blobs", "model=mlp",
            "model._target_=busy_model.BusyMLP", f"+model.busy_seconds={BUSY_S}", "trainer.batch_size=32",
            "trainer.max_steps=2", "trainer.log_every_n_steps=1", f"trainer.stall_timeout={SLOW_TIMEOUT}"]
SLOW = (r"rank 1 is slow, not stalled: (?P<speed>.*?samples/s.*?), (?P<cpu>\d+)% CPU, runnable at \d+ of \d+ looks "
        r"over the last [\d.]+ s, inside BusyMLP\.forward \(busy_model\.py:\d+\); at step (?P<step>\d+), "
        r"(?P<doing>[^;]*?) for [\d.]+ s")


def test_a_slow_but_busy_rank_is_called_slow_with_its_speed_and_the_run_goes_on(runs):
    run = runs.train(SLOW_RUN, env=user_code_env(EXAMPLE)).ok()
    text = run.stdout + run.stderr
    assert "the run stalled" not in text, text
    log = (run.run_dir / "train.log").read_text()
    slow = [m.groupdict() for m in re.finditer(SLOW, log)]
    doing = {(m["step"], m["doing"]) for m in slow}
    assert {("1", "forward/backward"), ("2", "forward/backward"), ("2", "evaluating")} <= doing, log
    # the first slow batch of a phase has only a bound; the second training step has the first one's measured speed
    first = next(m["speed"] for m in slow if m["step"] == "1")
    assert re.fullmatch(r"at most [\d.]+ samples/s \(a batch of 16 running for [\d.]+ s\)", first), first
    measured = [re.fullmatch(r"(?P<rate>[\d.e+-]+) samples/s \(its last batch: 16 samples in [\d.]+ s\)", m["speed"])
                for m in slow if m["step"] == "2" and m["doing"] == "forward/backward"]
    assert measured and all(measured), slow
    # a batch of 16 whose forward spun for 3 s took at least 3 s
    assert all(0 < float(m["rate"]) <= 16 / BUSY_S for m in measured), measured
    assert any(re.search(r"a batch of 128 running for", m["speed"]) for m in slow if m["doing"] == "evaluating"), slow
    assert run.result()["steps"] == 2
