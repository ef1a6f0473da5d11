"""Every process this process starts, noted as it starts it, whatever started it: subprocess (Popen, run,
check_output, `from subprocess import run`), os.system, os.posix_spawn and os.spawn*, os.fork (and os.forkpty), and
multiprocessing's processes of every start method (spawn and forkserver start theirs without an audit event, so
their start() is noted instead).

Python's audit hooks (sys.addaudithook, PEP 578) hear the first kinds wherever they happen, in the tests' code, the
framework's or a library's (inductor's compiler calls, provenance's git). tests/conftest.py fails a unit test that
started one not on tests/support/tiers.py's allowlist; tests/support/suite_report.py counts them per file."""
from __future__ import annotations

import multiprocessing.process
import os
import sys
import threading

# One line per process started, in order: what started it and the command (or the target) it runs.
started: list[str] = []
_EVENTS = {"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty"}
_inside = threading.local()  # a multiprocessing start is noted once, not again as the fork it makes
_installed = []


def install() -> None:
    """Notes every later start in this process (once per process: an audit hook cannot be removed)."""
    if _installed:
        return
    _installed.append(True)
    sys.addaudithook(_heard)
    original = multiprocessing.process.BaseProcess.start

    def start(process):
        started.append(f"multiprocessing: {process.name} ({_name(getattr(process, '_target', None))})")
        _inside.active = True
        try:
            return original(process)
        finally:
            _inside.active = False

    multiprocessing.process.BaseProcess.start = start


def _heard(event: str, args: tuple) -> None:
    if event not in _EVENTS or getattr(_inside, "active", False):
        return
    if event == "subprocess.Popen":
        argv = [args[1]] if isinstance(args[1], (str, bytes, os.PathLike)) else list(args[1])
        _inside.popen = argv  # subprocess may start it with os.posix_spawn: one start, noted once
        started.append(f"subprocess: {_command(argv)}")
    elif event == "os.posix_spawn":
        if args[1] != getattr(_inside, "popen", None):
            started.append(f"os.posix_spawn: {_command(args[1])}")
        _inside.popen = None
    elif event == "os.spawn":
        started.append(f"os.spawn: {_command(args[2])}")
    elif event == "os.system":
        started.append(f"os.system: {os.fsdecode(args[0])}")
    else:
        started.append(event)


def _command(argv) -> str:
    return " ".join(os.fsdecode(word) for word in argv)


def _name(target) -> str:
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
