"""A checkpoint that does not fit (disk full) or cannot be written (the folder turned read-only mid-run): one clear
error naming the folder, the bytes needed and free, and the last complete checkpoint (still loadable); nothing
half-written, exit code != 0, no worker left; the same for fsdp's DCP shards, blocking and written behind the loop. And the driver's warning before training when the run folder cannot
hold trainer.keep_checkpoints + 1 checkpoints. Real processes on a real small filesystem (a tmpfs: needs root)."""
import io
import os
import re
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from framework.checkpoints.store import list_checkpoints, newest_valid, verify
from framework.telemetry.progress import Console
from support.processes import faults_env, held_at, processes_tagged, start_train, wait_until_held

# A linear layer of 15000 x 10: about 1.2 MB per checkpoint with SGD's momentum, so a 3 MB filesystem holds two
# (steps 4 and 8) and the third (step 12, written before the oldest is pruned) does not fit.
RUN = ["dataset=synthetic", "dataset.shape=[15000]", "dataset.train_size=256", "dataset.test_size=64", "model=linear",
       "optimizer=sgd", "trainer.batch_size=32", "trainer.epochs=3", "trainer.checkpoint_every_n_steps=4",
       "trainer.log_every_n_steps=2"]
STRATEGIES = {"single": ["strategy=single"], "ddp": ["strategy=ddp", "strategy.nproc_per_node=2"]}


@contextmanager
def small_filesystem(path: Path, size: str):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a size-limited tmpfs")
    path.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                             text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-R", str(path)], capture_output=True)


def _start(run_dir: Path, args: list[str], tag: str) -> subprocess.Popen:
    """The run (tests/faults/ on its path: a run may wait at a step, held_at), its output in files off the small
    disk (a console that cannot write is another test's)."""
    return start_train([*args, f"hydra.run.dir={run_dir}"], run_dir.parent, {**faults_env(), "HYDRA_DIST_TEST_TAG": tag},
                       logs=_logs(run_dir))


def _logs(run_dir: Path) -> Path:
    return run_dir.parent.parent  # the test's tmp_path, beside the small disk


def _let_go(run_dir: Path) -> None:
    """The run waiting at its step (held_at) goes on."""
    for marker in run_dir.glob("held_at_step_*"):
        marker.unlink()


def _finish(proc: subprocess.Popen, tag: str, run_dir: Path) -> tuple[int, str, str, list[int]]:
    proc.wait(timeout=300)
    deadline = time.monotonic() + 10
    while processes_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    out, err = ((_logs(run_dir) / name).read_text() for name in ("train.out", "train.err"))
    return proc.returncode, out, err, processes_tagged(tag)


def _check_clean_stop(code: int, out: str, err: str, left: list[int], folder: Path, reason: str) -> re.Match:
    assert code == 1, out + err  # a failure while training (a refusal before it exits 2)
    assert not left, f"worker processes left behind: {left}"
    assert "Traceback" not in err and "Traceback" not in out, err
    found = re.search(rf"error: checkpoint (step-\d+\.pt) could not be written to {re.escape(str(folder))}: {reason}; "
                      r"it needs ([\d,]+) bytes and the filesystem there has ([\d,]+) bytes free\. Nothing of it was "
                      r"left behind; (.*)", err)
    assert found, err
    assert err.count("error: ") == 1, "one error, said once"
    best = [p.name for p in (folder / "best").iterdir()] if (folder / "best").exists() else []
    assert all(Path(name).suffix in (".pt", ".json") for name in best), best
    leftovers = [p.name for p in folder.iterdir() if p.suffix not in (".pt", ".json") and p.name != "best"]
    assert not leftovers, f"half-written files left: {leftovers}"
    committed = {c.path.name for c in list_checkpoints(folder)}
    assert {p.name for p in folder.glob("*.pt")} == committed, "every .pt left has its manifest"
    assert found.group(1) not in committed
    return found


def _check_last_checkpoint_named_and_loadable(found: re.Match, folder: Path, step: int) -> None:
    last = newest_valid(folder)
    assert last is not None and last.step == step and verify(last) is None
    assert found.group(4).startswith(f"the last complete checkpoint is {last.path} (step {step}), intact and loadable")
    state = torch.load(last.path, weights_only=True)
    assert state["position"]["step"] == step and torch.isfinite(state["model"]["fc.weight"]).all()


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_full_disk_stops_the_run_with_one_clear_error_and_keeps_the_last_checkpoint(tmp_path, strategy):
    with small_filesystem(tmp_path / "disk", "3m") as disk:
        tag = uuid.uuid4().hex
        code, out, err, left = _finish(_start(disk / "run", [*STRATEGIES[strategy], *RUN], tag), tag, disk / "run")
        folder = disk / "run" / "checkpoints"
        # the driver warned before training: 3 checkpoints of about 1.2 MB do not fit in 3 MB
        warning = re.search(r"warning: .* has ([\d,]+) bytes free, and this run's checkpoints need about ([\d,]+) "
                            r"\(trainer.keep_checkpoints=2 \+ 1 being written, 0 already there", out)
        assert warning and out.index(warning.group(0)) < out.index("training "), out
        found = _check_clean_stop(code, out, err, left, folder, re.escape("No space left on device (ENOSPC)"))
        assert found.group(1) == "step-00000012.pt"
        needed, free = (int(found.group(i).replace(",", "")) for i in (2, 3))
        assert (folder / "step-00000008.pt").stat().st_size < needed and free < needed
        estimate = int(warning.group(2).replace(",", "")) // 3
        assert abs(estimate - needed) < 0.05 * needed, "the driver's estimate is one real checkpoint's size"
        _check_last_checkpoint_named_and_loadable(found, folder, 8)


def test_a_first_checkpoint_that_does_not_fit_leaves_nothing_behind(tmp_path):
    with small_filesystem(tmp_path / "disk", "1m") as disk:
        tag = uuid.uuid4().hex
        code, out, err, left = _finish(_start(disk / "run", ["strategy=single", *RUN], tag), tag, disk / "run")
        folder = disk / "run" / "checkpoints"
        found = _check_clean_stop(code, out, err, left, folder, re.escape("No space left on device (ENOSPC)"))
        assert found.group(1) == "step-00000004.pt"
        assert found.group(4).startswith("no checkpoint of this run had been written yet")
        assert list(folder.iterdir()) == []


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_checkpoint_folder_turning_read_only_mid_run_stops_it_cleanly(tmp_path, strategy):
    with small_filesystem(tmp_path / "disk", "64m") as disk:
        tag = uuid.uuid4().hex
        run_dir = disk / "run"
        run_dir.mkdir()
        # the run waits at the end of step 5, its step-4 checkpoint written (tests/faults/hold.py)
        proc = _start(run_dir, held_at([*STRATEGIES[strategy], *RUN, "trainer.epochs=200"], step=5), tag)
        folder = run_dir / "checkpoints"
        wait_until_held(proc, run_dir)
        # The folder alone turns read-only (a read-only bind mount over it): a remount of the whole tmpfs is
        # refused while TensorBoard's event file is open for writing.
        subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        _let_go(run_dir)
        code, out, err, left = _finish(proc, tag, run_dir)
        found = _check_clean_stop(code, out, err, left, folder, re.escape("Read-only file system (EROFS)"))
        last = newest_valid(folder)
        assert found.group(1) == f"step-{last.step + 4:08d}.pt"
        _check_last_checkpoint_named_and_loadable(found, folder, last.step)


def _fill(disk: Path) -> None:
    """Another program takes every free byte."""
    try:
        with open(disk / "filler", "wb", buffering=0) as f:
            while True:
                f.write(b"x" * 65536)  # unbuffered: a short write takes what is left, then ENOSPC
    except OSError:
        pass


def test_a_disk_filled_by_someone_else_mid_run_stops_it_at_the_next_checkpoint(tmp_path):
    """Not a byte left: TensorBoard's events fail first (a warning, no traceback), then the checkpoint, which ends
    the run the same clean way."""
    with small_filesystem(tmp_path / "disk", "8m") as disk:
        tag = uuid.uuid4().hex
        run_dir = disk / "run"
        run_dir.mkdir()
        # a loss point every step: the event file outgrows its last page (tmpfs allocates whole pages) before the
        # next checkpoint, 256 steps on (time enough to fill the disk first)
        args = ["strategy=single", *RUN, "dataset.shape=[1000]", "dataset.train_size=8192", "trainer.epochs=200",
                "trainer.checkpoint_every_n_steps=256", "trainer.log_every_n_steps=1"]
        proc = _start(run_dir, held_at(args, step=257), tag)  # waits there, its step-256 checkpoint written
        folder = run_dir / "checkpoints"
        wait_until_held(proc, run_dir)
        _fill(disk)
        _let_go(run_dir)
        code, out, err, left = _finish(proc, tag, run_dir)
        assert "warning: TensorBoard's event file can no longer be written (No space left on device)" in out + err
        found = _check_clean_stop(code, out, err, left, folder, re.escape("No space left on device (ENOSPC)"))
        assert found.group(1) == "step-00000512.pt"
        _check_last_checkpoint_named_and_loadable(found, folder, 256)


def test_train_log_on_a_full_disk_warns_once_and_the_console_goes_on(tmp_path):
    with small_filesystem(tmp_path / "disk", "64k") as disk:
        stream = io.StringIO()
        say = Console(disk / "train.log", bar=False, stream=stream)
        say("first line")
        _fill(disk)
        for i in range(2000):  # more than the last page of train.log holds
            say(f"line {i} " + "x" * 40)
        lines = stream.getvalue().splitlines()
        assert lines.count(f"warning: {disk / 'train.log'} can no longer be written (No space left on device); "
                           "lines go to the console only") == 1
        assert lines[-1].startswith("line 1999 ") and len(lines) == 2002


@pytest.mark.parametrize("behind", [False, True], ids=["blocking", "async_checkpoint"])
def test_fsdp_shards_on_a_full_disk_stop_the_run_with_the_same_error_and_leave_nothing_of_them(tmp_path, behind):
    """DCP's shards (every rank writes its own): the workers failed with DCP's CheckpointException, a traceback per
    rank, and left the shard folder that did not fit. Now the one error of a single file, every rank together."""
    with small_filesystem(tmp_path / "disk", "3m") as disk:
        tag = uuid.uuid4().hex
        args = ["strategy=fsdp", "strategy.nproc_per_node=2", *RUN, f"trainer.async_checkpoint={str(behind).lower()}"]
        code, out, err, left = _finish(_start(disk / "run", args, tag), tag, disk / "run")
        folder = disk / "run" / "checkpoints"
        assert code == 1 and not left and "Traceback" not in out + err, out + err
        behind_line = re.escape("rank 0, step 12 (written behind the loop, trainer.async_checkpoint): ") if behind else ""
        found = re.search(rf"error: {behind_line}checkpoint step-00000012 could not be written to {re.escape(str(folder))}"
                          r": No space left on device \(ENOSPC\); it needs ([\d,]+) bytes and the filesystem there has "
                          r"([\d,]+) bytes free\. Nothing of it was left behind; the last complete checkpoint is "
                          rf"{re.escape(str(folder / 'step-00000008'))} \(step 8\), intact and loadable", err)
        assert found and err.count("error: ") == 1, err
        needed, free = (int(found.group(i).replace(",", "")) for i in (1, 2))
        assert free < needed
        assert sorted(p.name for p in folder.iterdir() if p.name != "best") == [
            "step-00000004", "step-00000004.json", "step-00000008", "step-00000008.json"], "a part of step 12's"
        last = newest_valid(folder)
        assert last.step == 8 and verify(last) is None


def test_deepspeed_on_a_full_disk_fails_but_loses_nothing(tmp_path):
    """What is guaranteed for DeepSpeed's own shard writes (not yet the one clean error above): the run fails with
    exit code != 0 and no worker left, the shard folder that did not fit never counts, and the last committed
    checkpoint stays valid for trainer.resume."""
    pytest.importorskip("deepspeed")
    with small_filesystem(tmp_path / "disk", "3m") as disk:
        tag = uuid.uuid4().hex
        args = ["strategy=deepspeed", "strategy.nproc_per_node=2", "strategy.zero_stage=2", *RUN]
        code, out, err, left = _finish(_start(disk / "run", args, tag), tag, disk / "run")
        assert code == 1 and not left and "error: " in err, out + err
        folder = disk / "run" / "checkpoints"
        last = newest_valid(folder)
        assert last is not None and last.step == 4 and verify(last) is None
        assert [c.step for c in list_checkpoints(folder)] == [4], "the folder that did not fit is no checkpoint"
