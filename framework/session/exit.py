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


STOP_GRACE_S = 5.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_watching = False


def end_soon_after_a_stop_signal(grace: float = STOP_GRACE_S) -> None:
    """For a worker that a launcher stops by signal (torch's agent passes Ctrl-C on as SIGINT; a terminal sends it to
    every process too). Python raises KeyboardInterrupt only when the main thread runs Python again: one blocked
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
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    os.register_at_fork(after_in_child=_forget_wakeup_fd)  # a forked DataLoader worker's signals are not ours
    threading.Thread(target=_end_after_grace, args=(read_end, grace), name="stop-signal-grace", daemon=True).start()


def _forget_wakeup_fd() -> None:
    with contextlib.suppress(ValueError):  # forked from a thread other than the main one: nothing was inherited
        signal.set_wakeup_fd(-1)


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
