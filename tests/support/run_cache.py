"""Runs shared by every test that reads them, across test files and both pytest-xdist workers.

A process test often needs a run only to read what it left (losses, TensorBoard tags, checkpoints, result.json):
the same command in several tests is one run. `runs.train(args)` starts train.py once per session for a given command
(the overrides with the accelerator pinned, the launcher, the extra environment, a fault plan) and hands every later
caller the same finished run; a file lock makes the second xdist worker wait for the first instead of training again
(the pattern pytest-xdist documents for session fixtures). A shared run is read-only: a test that resumes into it or
changes its files copies it first (`Run.copy_to`). A run whose start was stopped (its command's timeout, the
test's) is recorded as such: every later reader fails at once with what stopped it and the output until then, and
nobody starts it again (a hang would otherwise cost each reader its own timeout).

A test that needs a run of its own (it stops the run, watches it live, or its subject is the start itself) calls
run_train and says why in one line."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from filelock import FileLock

from support.processes import RANK_VARIABLES, check_ok, pin_accelerator, run_train, with_faults
from support.run_files import run_dirs

LOCK_WAIT_S = 1800  # the other worker may be building a long run (or several, in order) first


@dataclass(frozen=True)
class Run:
    """A finished train.py (or eval.py, a sweep) command: where it ran, its exit code and output."""

    cwd: Path
    returncode: int
    stdout: str
    stderr: str

    def ok(self) -> "Run":
        check_ok(self)  # the same message as a run of the test's own
        return self

    @property
    def run_dir(self) -> Path:
        """The one run folder (a Hydra job folder) the command made."""
        [folder] = run_dirs(self.cwd)
        return folder

    @property
    def jobs(self) -> list[Path]:
        """Every job folder the command made (a sweep's jobs, in order)."""
        return run_dirs(self.cwd)

    def result(self) -> dict:
        return json.loads((self.run_dir / "result.json").read_text())

    def copy_to(self, destination: Path) -> Path:
        """A copy of the run folder a test may change (resume into it, damage a file); returns it."""
        shutil.copytree(self.run_dir, destination, symlinks=True)
        return destination


class RunCache:
    """Shared runs under one folder of this test session (every xdist worker of the session sees the same one)."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def train(self, args: list[str], *, env: dict | None = None, launcher: list[str] | None = None,
              faults: str | None = None, timeout: float = 600, command: list[str] | None = None) -> Run:
        """train.py with these overrides (on the test's accelerator, as run_train pins it), run once per session.
        command: another script in train.py's place (eval.py), with its arguments as given."""
        args, env = with_faults(args, env, faults)
        inherited = {name: os.environ[name] for name in RANK_VARIABLES if name in os.environ and name not in env}
        if inherited:  # the key holds the test's env only: one test's leak would decide every later reader's run
            pytest.fail(f"a shared run would inherit {inherited} from the test process and take itself for a rank "
                        "of another job: a test left them (tests/conftest.py names it) or the suite runs under a "
                        "launcher; a test that means them passes them in env=", pytrace=False)
        pinned = list(args) if command else pin_accelerator(args)
        key = _key({"args": pinned, "env": env, "launcher": launcher, "command": command})
        return self._once(key, lambda cwd: run_train(pinned, cwd, timeout=timeout, env=env, launcher=launcher,
                                                     script=command))

    def folder(self, name: str, make: Callable[[Path], None]) -> Path:
        """A folder of inputs made once per session (a copy of the example project, a dataset written to disk):
        `make(path)` fills it the first time. Paths inside shared runs' commands stay equal across workers, so their
        runs are shared too."""
        folder = self.root / "folders" / name
        with FileLock(str(self.root / "folders" / f"{name}.lock"), timeout=LOCK_WAIT_S):
            if not (folder / ".made").exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(parents=True)
                make(folder)
                (folder / ".made").touch()
        return folder

    def _once(self, key: str, start: Callable[[Path], object]) -> Run:
        home = self.root / key
        done = home / "done.json"
        with FileLock(str(self.root / f"{key}.lock"), timeout=LOCK_WAIT_S):
            if not done.exists():
                shutil.rmtree(home, ignore_errors=True)  # a run killed with its test (a timeout) left half a folder
                (home / "cwd").mkdir(parents=True)
                try:
                    proc = start(home / "cwd")
                except BaseException as stopped:
                    if not isinstance(stopped, KeyboardInterrupt):  # a user's Ctrl-C ends the session anyway
                        _write(done, {"stopped": _what_stopped(stopped), "test": os.environ.get("PYTEST_CURRENT_TEST")})
                    raise
                _write(done, {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr})
        saved = json.loads(done.read_text())
        if "stopped" in saved:
            pytest.fail(f"this shared run was stopped in an earlier test ({saved['test']}) and is not started again; "
                        f"what stopped it:\n{saved['stopped']}", pytrace=False)
        return Run(home / "cwd", saved["returncode"], saved["stdout"], saved["stderr"])


def _write(done: Path, record: dict) -> None:
    """done.json whole or not at all: a reader never finds half of it."""
    partial = done.with_suffix(".partial")
    partial.write_text(json.dumps(record))
    partial.replace(done)


def _what_stopped(exc: BaseException) -> str:
    """The exception that ended a shared run's start (its command's timeout, the test's timeout), with the output the
    command had written by then (support.processes.run_in_own_session adds it as a note)."""
    return "".join(traceback.format_exception_only(exc)).rstrip()


def _key(what: dict) -> str:
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def cache_root(basetemp: Path) -> Path:
    """The session's cache folder: beside the xdist workers' own temporary folders (pytest-N/popen-gwK share
    pytest-N), or in the temporary folder of a run without xdist."""
    return (basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp) / "shared_runs"


def example_project(runs: RunCache) -> "Project":
    """examples/my_project (a user's package and config dir, docs/your-own-code.md), copied once per session: runs of
    the same command from any test file then share one run folder. Read-only: a test that adds files to the project
    makes a copy of its own (Project.copy_to)."""
    from support.processes import EXAMPLE

    root = runs.folder("my_project", lambda folder: shutil.copytree(
        EXAMPLE, folder / "my_project", ignore=shutil.ignore_patterns("__pycache__")))
    return Project(root / "my_project")


@dataclass(frozen=True)
class Project:
    """A user's project outside this repository: its package on PYTHONPATH and its config dir."""

    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "conf"

    def args(self, *overrides: str) -> list[str]:
        return ["--config-dir", str(self.conf), *overrides]

    def env(self, *more: Path | str) -> dict:
        from support.processes import python_path

        return python_path(self.root, *more)

    def copy_to(self, destination: Path) -> "Project":
        shutil.copytree(self.root, destination, ignore=shutil.ignore_patterns("__pycache__"))
        return Project(destination)
