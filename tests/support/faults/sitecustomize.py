"""Test-only: SIGKILL a worker halfway through writing a checkpoint (what a node failure or the OOM killer does),
without a hook in the checkpoint writer. Python imports `sitecustomize` at start-up from PYTHONPATH, so a run started
with this folder on PYTHONPATH and HYDRA_DIST_TEST_KILL_IN_CHECKPOINT=<step>:<rank> loads it in every process it
starts. The writer fsyncs a checkpoint's temporary file before renaming it into place: at that moment, in the
named rank's first attempt, the file is cut to half its bytes and the process killed."""
import os
import signal

_SPEC = os.environ.get("HYDRA_DIST_TEST_KILL_IN_CHECKPOINT")

if _SPEC:
    _step, _rank = (int(v) for v in _SPEC.split(":"))
    _names = (f"step-{_step:08d}.pt.tmp", f"step-{_step:08d}/training_state.pt.tmp")
    _fsync = os.fsync

    def _fsync_or_die(fd):
        # read now, not at start-up: the elastic agent's spawned workers get their environment after it
        rank = int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if first_attempt and rank == _rank and path.endswith(_names):
            os.ftruncate(fd, os.fstat(fd).st_size // 2)
            print(f"fault injection: SIGKILL halfway through {path} (pid {os.getpid()})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return _fsync(fd)

    os.fsync = _fsync_or_die

# HYDRA_DIST_TEST_HOLD_IN_CHECKPOINT=<step>:<rank>:<suffix>: the write of a file of checkpoint <step> whose name ends
# with <suffix> (a manifest's `.json.tmp`, a shard folder's `training_state.pt.tmp`) holds, on the named rank in its
# first attempt, at its fsync: it writes <run folder>/held_in_checkpoint_<step> and waits until the test kills the
# run. The loop goes on meanwhile where the checkpoint is written behind it (trainer.async_checkpoint).
_HOLD = os.environ.get("HYDRA_DIST_TEST_HOLD_IN_CHECKPOINT")

if _HOLD:
    import pathlib
    import time

    _hold_step, _hold_rank, _hold_suffix = _HOLD.split(":")
    _hold_name = f"step-{int(_hold_step):08d}"
    _fsync_before_hold = os.fsync

    def _fsync_or_hold(fd):
        rank = int(os.environ.get("RANK", "0"))
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if first_attempt and rank == int(_hold_rank) and _hold_name in path and path.endswith(_hold_suffix):
            parts = pathlib.Path(path).parts
            run_dir = pathlib.Path(*parts[:parts.index("checkpoints")])
            (run_dir / f"held_in_checkpoint_{_hold_step}").write_text(path)
            while True:  # until the test kills the run
                time.sleep(1)
        return _fsync_before_hold(fd)

    os.fsync = _fsync_or_hold
