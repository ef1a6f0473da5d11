"""Run a command and stamp every output line with the seconds since the command started.

Both sides of a comparison are timed this way, from outside, so a framework and a hand-written
baseline are measured by the same clock and the same method."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass
class TimedOutput:
    command: list[str]
    lines: list[tuple[float, str]] = field(default_factory=list)  # (seconds since start, line)
    returncode: int | None = None
    wall_seconds: float = 0.0
    stopped_early: bool = False
    timed_out: bool = False

    def text(self, last: int = 40) -> str:
        return "\n".join(line for _, line in self.lines[-last:])

    def problem(self) -> str | None:
        """Why the command did not finish normally; None when it did (or was stopped on purpose)."""
        if self.timed_out:
            return "timed out"
        if self.returncode != 0 and not self.stopped_early:
            return f"exit code {self.returncode}"
        return None

    def check(self) -> "TimedOutput":
        """Raise with the output's tail unless the command finished normally (or was stopped on purpose)."""
        problem = self.problem()
        if problem is not None:
            raise RuntimeError(f"{' '.join(self.command)}: {problem}\n{self.text()}")
        return self


def run_timed(command: list[str], cwd: Path, env: dict[str, str], timeout: float,
              stop_when: Callable[[str], bool] | None = None) -> TimedOutput:
    """Run `command`; return its stdout+stderr lines with timestamps. When `stop_when(line)` is true the
    command's whole process group is terminated (used to stop training once a target is reached)."""
    out = TimedOutput(command=list(command))
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, start_new_session=True)
    watchdog = threading.Timer(timeout, _on_timeout, args=(proc, out))
    watchdog.start()
    try:
        for line in proc.stdout:
            out.lines.append((time.perf_counter() - start, line.rstrip("\n")))
            if stop_when and stop_when(line):
                out.stopped_early = True
                _stop_group(proc)
                break
        proc.stdout.close()
        out.returncode = proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            _stop_group(proc)
    out.wall_seconds = time.perf_counter() - start
    return out


def _on_timeout(proc: subprocess.Popen, out: TimedOutput) -> None:
    out.timed_out = True
    _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """Terminate the process group we started (train.py's ddp workers and torchrun's children live there)."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
