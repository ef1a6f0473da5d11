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
