"""The suite's tiers, fixtures and rules (docs/testing.md says which tier a new test goes in):

- tests/unit/: in-process checks; nothing here starts a process: collection fails a test whose code names a process
  starter (support/tiers.py), and a test that starts one anyway, through any code, fails when it ends unless
  tiers.py's allowlist names it (support/launches.py notes every start).
- tests/dist/: distributed units on a persistent gloo world of 2 or 4 ranks per module (support/gloo_world.py).
- tests/runs/ and tests/engines/: real processes, where the subject is a process (launch, signals, ranks' files,
  resume) or an engine's run; a run that several tests read is made once per session (support/run_cache.py).

Helpers live in tests/support/: processes.py (start, hold and stop runs), run_files.py (read what they left),
driver.py (the driver's checks in this process), run_cache.py, gloo_world.py, tiers.py, launches.py, suite_report.py
(the plugin that prints where the suite's time went), user_code/ and faults/ (what runs import from the tests)."""
from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from multiprocessing import resource_tracker
from pathlib import Path

import pytest
import torch

pytest.register_assert_rewrite("support")  # the helpers' assertions explain themselves as the tests' do (and count)

import framework.config  # noqa: F401  (registers the config schemas: the tests compose conf/ with Hydra too)
from framework.session.environment import _ranks
from support import launches, processes
from support.gloo_world import GlooWorld
from support.processes import TEST_ID, USER_CODE, kill_tagged, launch_variables
from support.run_cache import RunCache, cache_root
from support.tiers import not_allowed

sys.path.insert(0, str(USER_CODE))  # the probes and models runs import by _target_, importable here as in a run
# inductor compiles in the process that compiles, not in a pool of worker processes it starts (each imports torch:
# seconds of CPU on 2 cores, for the few graphs a test compiles); the runs the tests start inherit it
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

pytest_plugins = ["pytester", "support.suite_report"]  # tests/unit/test_cuda_paths.py runs this conftest in a pytest of its own

TESTS = Path(__file__).resolve().parent
# Seconds a test may take before it fails and everything it started is killed: one hang must not eat the CI's time.
# A process test's budget covers building the shared runs it is the first to read; a shared run stopped by it is
# recorded, and its later readers fail at once instead of starting it again (support/run_cache.py).
TIMEOUTS = {"unit": 120, "dist": 300, "runs": 900, "engines": 900}
PROCESS_TIERS = ("dist", "runs", "engines")
# Heaviest files first (wall-seconds of a full run, tests/support/file_weights.json): the two xdist workers
# then end together instead of one waiting for the other's last long file.
WEIGHTS = TESTS / "support" / "file_weights.json"
_FIRST_LAUNCH = pytest.StashKey[int]()


def pytest_configure(config):
    """The tests that stop a run with Ctrl-C send SIGINT to processes they start, which inherit this process's ignored
    and blocked signals across exec: a suite started as a shell's background job (`make test &`, a CI script run
    with `&`) has SIGINT and SIGQUIT ignored, so every driver it started ignored the test's Ctrl-C and the workers
    outlived the agent's SIGINT until its SIGKILL 30 s later. The stop signals are put back to Python's own."""
    for sig, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL),
                         (signal.SIGQUIT, signal.SIG_DFL)):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGQUIT})
    launches.install()
    # multiprocessing's resource tracker, started now, before any test's or module's id: started by the first spawn
    # of a test it would carry that id, and be killed with that test while it serves every later one's processes
    resource_tracker.ensure_running()


def tier_of(item) -> str:
    parts = Path(str(item.fspath)).resolve().relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 else "unit"


def pytest_collection_modifyitems(config, items):
    from support.tiers import starts_processes

    misplaced = []
    for item in items:
        tier = tier_of(item)
        if tier in PROCESS_TIERS:
            item.add_marker(pytest.mark.slow)
        elif starts_processes(item):
            misplaced.append(item.nodeid)
        if tier == "dist":  # the distributed units start their worlds once per module: every `make test` runs them
            item.add_marker(pytest.mark.core)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIMEOUTS.get(tier, TIMEOUTS["unit"])))
    if misplaced:
        raise pytest.UsageError("these tests start processes, so they belong in tests/runs/ (or tests/engines/, "
                                "tests/dist/), not tests/unit/: " + ", ".join(misplaced))
    weights = json.loads(WEIGHTS.read_text()) if WEIGHTS.exists() else {}
    position = {}
    for i, item in enumerate(items):
        position.setdefault(item.nodeid.split("::")[0], i)
    items.sort(key=lambda item: (-weights.get(item.nodeid.split("::")[0], 0), position[item.nodeid.split("::")[0]]))


# The accelerator of the test that runs now: gpu for a test marked gpu, cpu for every other.
@pytest.fixture(autouse=True)
def _test_accelerator(request):
    """Pins the accelerator runs of this test use (processes.pin_accelerator), and after a GPU test puts back the
    current CUDA device: a test that left set_device(1) would make the next one time cuda:0 while its work runs on
    cuda:1."""
    gpu_test = request.node.get_closest_marker("gpu") is not None
    processes.accelerator[0] = "gpu" if gpu_test else "cpu"
    device = torch.cuda.current_device() if gpu_test and torch.cuda.is_available() else None
    yield
    processes.accelerator[0] = "cpu"
    if device is not None:
        torch.cuda.set_device(device)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_FIRST_LAUNCH] = len(launches.started)  # before any fixture of the test, module-scoped ones too


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A unit test that started a process not on the allowlist (support/tiers.py) fails when it ends, whatever started
    it: the test, a fixture, the framework or a library, in its setup, body or teardown."""
    report = (yield).get_result()
    if call.when != "teardown" or tier_of(item) != "unit" or _FIRST_LAUNCH not in item.stash:
        return
    unlisted = not_allowed(launches.started[item.stash[_FIRST_LAUNCH]:])
    if unlisted and not report.failed:
        report.outcome = "failed"
        report.longrepr = ("this test in tests/unit/ started processes that support/tiers.py does not allow there (a "
                           "test that starts processes belongs in tests/runs/, tests/engines/ or tests/dist/):\n  "
                           + "\n  ".join(unlisted))


@pytest.fixture(scope="module", autouse=True)
def _end_what_the_module_started():
    """Processes a module-scoped fixture starts (a shared run's build, a gloo world) carry the module's id; whatever
    of them still runs when the module ends is killed then. The tests' own ids take its place while each runs."""
    module_id = uuid.uuid4().hex
    os.environ[TEST_ID] = module_id
    try:
        yield module_id
    finally:
        os.environ.pop(TEST_ID, None)
        kill_tagged(module_id, TEST_ID)


@pytest.fixture(autouse=True)
def _end_what_the_test_started(_end_what_the_module_started):
    """Every process a test starts inherits its id (TEST_ID); whatever is still running when the test ends (it
    failed half-way, it timed out, it forgot one) is killed then, so that it cannot hold a port, a GPU or a core in
    a later test."""
    test_id = uuid.uuid4().hex
    os.environ[TEST_ID] = test_id
    try:
        yield
    finally:
        os.environ[TEST_ID] = _end_what_the_module_started
        kill_tagged(test_id, TEST_ID)


@pytest.fixture(autouse=True)
def _no_launch_variable_left():
    """A test that leaves a rank's variable (LOCAL_RANK, RANK, MASTER_PORT, SLURM's) in this process's environment
    fails, and the variable is put back: every later test of this xdist worker, and every run they start, would
    inherit it (a monkeypatch.delenv of an unset variable records no undo: setenv(name, "") first)."""
    before = launch_variables(os.environ)
    yield
    after = launch_variables(os.environ)
    if after == before:
        return
    for name in after.keys() - before.keys():
        del os.environ[name]
    os.environ.update(before)
    changed = [f"{name} from {before.get(name)!r} to {after.get(name)!r}"
               for name in sorted(before.keys() | after.keys()) if before.get(name) != after.get(name)]
    pytest.fail(f"the test changed this process's {', '.join(changed)} and left it so (put back now)", pytrace=False)


@pytest.fixture(autouse=True)
def _ranks_read_per_test():
    """A process reads its ranks once (framework/session/environment.py); each test reads them again, so that one
    test's faked environment does not stay in the next one's."""
    _ranks.cache_clear()
    yield
    _ranks.cache_clear()


@pytest.fixture(autouse=True)
def _forget_user_packages():
    """Tests that import a copy of examples/my_project in this process (driver checks in-process) each bring their
    own copy: the next test must import its own, not find the last one's in sys.modules."""
    yield
    for name in [n for n in sys.modules if n == "mypkg" or n.startswith("mypkg.")]:
        del sys.modules[name]


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> RunCache:
    """The session's shared runs (support/run_cache.py): runs.train(args) trains once, every reader gets that run."""
    return RunCache(cache_root(tmp_path_factory.getbasetemp()))


def _gloo_world(size: int, module_id: str) -> GlooWorld:
    """A world of `size` ranks for a module's distributed units (support/gloo_world.py), started now; its ranks
    carry the module's id, not the current test's, since the world outlives the test that first asks for it (and a
    test that restarts it)."""
    world = GlooWorld(size, env={TEST_ID: module_id})
    world.start()
    return world


@pytest.fixture(scope="module")
def world2(_end_what_the_module_started):
    """Two gloo ranks for this module's distributed units."""
    with _gloo_world(2, _end_what_the_module_started) as world:
        yield world


@pytest.fixture(scope="module")
def world4(_end_what_the_module_started):
    """Four gloo ranks for this module's distributed units."""
    with _gloo_world(4, _end_what_the_module_started) as world:
        yield world
