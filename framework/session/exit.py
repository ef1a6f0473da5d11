"""Leaving a worker process whose run has finished, without the interpreter's native teardown.

Once the results are handed over and the process group is shut down, only interpreter teardown is left,
and there a C++ thread destructor of torch's distributed stack now and then aborts the process
("terminate called without an active exception", SIGABRT). Seen with ddp under torchrun and with
DeepSpeed; it turned finished runs into failed ones. A finished worker therefore exits at once.
A stopped one (SIGINT, SIGTERM) exits within seconds, whatever its main thread is blocked in."""
from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.util
import os
import shutil
import signal
import sys
import threading
import time


def exit_now(code: int = 0) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


_command_status: list[int] = []  # the command's exit status, once it is known
_interpreter_exit: list[bool] = []  # set: the command ends through Python's own teardown after all


@contextlib.contextmanager
def quick_exit():
    """Around a command (train.py, eval.py): once it has ended, what is left of its exit is the interpreter's teardown
    of torch's modules, about 1 s on 2 cores (and there the same abort as in workers). Python ends as always (it
    prints a SystemExit's message or a traceback, joins non-daemon threads, runs the exit handlers registered after
    this one: DataLoader workers, the worker template and a joblib pool are stopped, logging is flushed); the last
    exit handler, registered here first, then ends the process with the command's status (and removes what
    multiprocessing's own handler, registered before it, would have). A KeyboardInterrupt keeps Python's own exit (it
    reports the signal)."""
    atexit.register(_end_with_status)
    try:
        yield
        _command_status.append(0)
    except SystemExit as exc:
        code = exc.code
        _command_status.append(0 if code is None else code if isinstance(code, int) else 1)
        raise
    except KeyboardInterrupt:
        raise
    except BaseException:
        _command_status.append(1)
        raise


def _end_with_status() -> None:
    if _command_status and not _interpreter_exit:
        _remove_multiprocessing_folder()
        exit_now(_command_status[-1])


def _remove_multiprocessing_folder() -> None:
    """multiprocessing's folder for its sockets (pymp-* in the temp folder: the workers' template's listener). Its own
    exit handler removes it, but was registered before ours, so the quick exit skipped it: every ddp run and every
    refusal after the template started left one behind."""
    shutil.rmtree(multiprocessing.util.get_temp_dir(), ignore_errors=True)


def end_through_the_interpreter() -> None:
    """A sweep's driver: its launcher's pools (joblib's loky processes, their semaphores) are released while the
    interpreter tears down, and a second there is nothing against a sweep's minutes."""
    _interpreter_exit.append(True)


def exit_at_end_of_finished_worker() -> None:
    """For a worker the elastic agent spawned: its result travels back when the entry function returns,
    so the exit happens at interpreter shutdown (registered last, so it runs first)."""
    if multiprocessing.parent_process() is not None:
        atexit.register(exit_now, 0)


# gloo's words for a collective whose peer's process is gone (SIGKILL, the OOM killer, a crash)
_PEER_GONE = ("closed by peer", "reset by peer")
PEER_GONE_WAIT_S = 2.0


def after_a_peer_vanished(exc: BaseException) -> None:
    """A worker whose collective failed because a peer's process vanished waits a moment before it fails itself:
    torch's agent (it polls every 0.1 s) reports the first ended worker it finds, and this one's error, a consequence,
    was often found before the dead rank, so the driver named the survivor. Its stop (the agent's SIGTERM) ends the
    wait."""
    if any(words in str(exc) for words in _PEER_GONE):
        with contextlib.suppress(KeyboardInterrupt):  # the agent's stop: it has found the rank that died
            time.sleep(PEER_GONE_WAIT_S)


STOP_GRACE_S = 5.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_watching = False


class StopSignal(KeyboardInterrupt):
    """SIGTERM in a worker, raised where its main thread is, as Ctrl-C's KeyboardInterrupt is (and caught with it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop(signum, frame) -> None:
    raise StopSignal(signum)


def end_soon_after_a_stop_signal(grace: float = STOP_GRACE_S) -> None:
    """For a worker that a launcher stops by signal (torch's agent passes the driver's Ctrl-C or SIGTERM on; a
    terminal sends SIGINT to every process too). SIGTERM is raised as SIGINT is, so a stopped worker unwinds
    (a checkpoint's temporary file is taken away, a write behind the loop waited for) instead of vanishing halfway
    through a write. Python raises only when the main thread runs Python again: one blocked
    in a collective whose peer already left, or in a teardown waiting for it, held the worker until the launcher's
    SIGKILL 30 s later. A thread woken by the signal itself (signal.set_wakeup_fd: written by the C-level handler
    whatever the main thread does) ends the process if it is still there `grace` seconds later."""
    global _watching
    if _watching or threading.current_thread() is not threading.main_thread():
        return
    _watching = True
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # inherited: a script's `train.py &` (no job control) starts the driver with SIGINT ignored, and the worker
        # template passes that on; the agent stops its workers with SIGINT all the same (then SIGKILL, 30 s later)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_stop)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    os.register_at_fork(after_in_child=_forget_wakeup_fd)  # a forked DataLoader worker's signals are not ours
    threading.Thread(target=_end_after_grace, args=(read_end, grace), name="stop-signal-grace", daemon=True).start()


def _forget_wakeup_fd() -> None:
    with contextlib.suppress(ValueError):  # forked from a thread other than the main one: nothing was inherited
        signal.set_wakeup_fd(-1)
        if signal.getsignal(signal.SIGTERM) is _raise_stop:  # a DataLoader worker ends on SIGTERM as it always did
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _end_after_grace(read_end: int, grace: float) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, set(_STOP_SIGNALS))  # the main thread takes them (KeyboardInterrupt)
    while True:
        received = os.read(read_end, 64)
        if not received:
            return
        stop = next((s for s in received if s in _STOP_SIGNALS), None)
        if stop is not None:
            break
    time.sleep(grace)
    exit_now(128 + stop)
