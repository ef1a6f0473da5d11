"""A pytest plugin: at the end of the suite, the ten test files with the most CPU-seconds and process launches, so
every CI log shows where the suite's time goes, and how many assert statements passed (pytest's assertion pass hook,
on in pyproject.toml). An assert counts once per test however often it ran: one in a loop over 40 steps is one check
of the test, not 40 (the count compares runs of this suite; it does not measure how much a test checks).

A launch is one process the test process started (train.py, eval.py, torchrun, a pytest of its own, a gloo world's
rank, the compiler inductor runs: support/launches.py; the workers those start are their own business).
CPU-seconds are the test process's own plus those of every child it waited for (with theirs: a driver waits for its
workers), read from getrusage around each test. Under pytest-xdist each worker measures its tests and the numbers
travel to the controller in the reports' user_properties.

HYDRA_DIST_RECORD_WEIGHTS=1 writes each file's wall-seconds to tests/support/file_weights.json, the order in which
tests/conftest.py hands files to the xdist workers (heaviest first)."""
from __future__ import annotations

import json
import os
import resource
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from support import launches

WEIGHTS = Path(__file__).with_name("file_weights.json")
TESTS = str(Path(__file__).resolve().parents[1])
def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class SuiteReport:
    def __init__(self):
        self.start: dict[str, tuple[int, float]] = {}
        self.files: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0])  # launches, CPU-s, wall-s, asserts
        self.passed_assertions: set[tuple[str, int]] = set()  # this test's assert statements that passed

    def pytest_assertion_pass(self, item, lineno, orig, expl):
        """Notes the tests' own assert statements (file and line): pytest also rewrites the packages of plugins it
        loads from entry points (all of Hydra), whose internal asserts are no check of ours."""
        frame = sys._getframe(1)
        while frame is not None and ("/_pytest/" in frame.f_code.co_filename or "/pluggy/" in frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None and (frame.f_code.co_filename.startswith(TESTS)
                                  or frame.f_code.co_filename == str(item.path)):
            self.passed_assertions.add((frame.f_code.co_filename, lineno))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        self.start[item.nodeid] = (len(launches.started), _cpu_seconds())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if call.when == "teardown" and item.nodeid in self.start:
            first_launch, cpu = self.start.pop(item.nodeid)
            report.user_properties.append(("launches", len(launches.started) - first_launch))
            report.user_properties.append(("cpu_seconds", round(_cpu_seconds() - cpu, 2)))
            report.user_properties.append(("assertions", len(self.passed_assertions)))
            self.passed_assertions = set()

    def pytest_runtest_logreport(self, report):
        row = self.files[report.nodeid.split("::", 1)[0]]
        row[2] += report.duration
        for key, value in report.user_properties:
            if key == "launches":
                row[0] += value
            elif key == "cpu_seconds":
                row[1] += value
            elif key == "assertions":
                row[3] += value

    def pytest_terminal_summary(self, terminalreporter):
        if not self.files or hasattr(terminalreporter.config, "workerinput"):
            return
        rows = sorted(self.files.items(), key=lambda kv: (kv[1][1], kv[1][0]), reverse=True)
        total = [sum(r[i] for _, r in rows) for i in range(4)]
        write = terminalreporter.write_line
        terminalreporter.section("where the suite's time went (tests/support/suite_report.py)")
        write(f"{'file':<56} {'launches':>8} {'CPU-s':>8} {'wall-s':>8}")
        for name, (started, cpu, wall, _) in rows[:10]:
            write(f"{name:<56} {started:>8} {cpu:>8.0f} {wall:>8.0f}")
        write(f"{'all ' + str(len(rows)) + ' files':<56} {total[0]:>8} {total[1]:>8.0f} {total[2]:>8.0f}")
        write(f"{total[3]} assert statements passed (each once per test, however often it ran)")
        if os.environ.get("HYDRA_DIST_RECORD_WEIGHTS") == "1":
            WEIGHTS.write_text(json.dumps({name: round(row[2]) for name, row in rows}, indent=0, sort_keys=True) + "\n")
            write(f"file weights written to {WEIGHTS}")


def pytest_configure(config):
    launches.install()
    config.pluginmanager.register(SuiteReport(), "suite_report_counts")
