"""The suite's own harness (tests/conftest.py, support/suite_report.py), each time in a pytest of its own with this
conftest: a unit test that starts a process by any way but the allowed ones fails, one that leaves a rank's variable
behind fails, the report counts an assert in a loop once, and a process a module-scoped fixture left running, in a
session of its own, is killed when its module ends."""
import os
import textwrap
import uuid

from support.processes import REPO, gone_within, kill_tagged

STARTS = """
    import os
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context
    from subprocess import run as go

    def test_from_an_imported_name():
        go(["true"])

    def test_os_system():
        os.system("true")

    def test_a_process_pool():
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            pool.submit(os.getpid).result()

    def test_provenance_s_git_is_allowed():
        go(["git", "-C", os.getcwd(), "rev-parse", "--show-toplevel"], capture_output=True)

    def test_leaves_local_rank():
        os.environ["LOCAL_RANK"] = "1"

    def test_after_the_leak():
        assert "LOCAL_RANK" not in os.environ

    def test_an_assert_in_a_loop():
        for step in range(40):
            assert step >= 0
"""

LEAVES_A_SERVER = """
    import subprocess

    import pytest

    @pytest.fixture(scope="module")
    def server():
        return subprocess.Popen(["sleep", "300"], start_new_session=True)

    def test_reads_the_server(server):
        assert server.poll() is None
"""


def _suite(pytester, monkeypatch, tier: str, test: str) -> None:
    """A pytest of its own with this suite's conftest and one test file in `tier`'s folder."""
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    pytester.makeini("[pytest]\nenable_assertion_pass_hook = true\n")  # as pyproject.toml has it
    monkeypatch.setenv("PYTHONPATH", f"{REPO / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")  # support/
    pytester.mkdir(tier)
    pytester.path.joinpath(tier, "test_it.py").write_text(textwrap.dedent(test))


def test_a_unit_test_that_starts_a_process_or_leaves_a_rank_variable_fails_and_asserts_count_once(pytester,
                                                                                                 monkeypatch):
    """None of these starts is seen by the collection's reading of the source (support/tiers.py's STARTERS)."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    _suite(pytester, monkeypatch, "unit", STARTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=7, errors=4)
    out = result.stdout.str()
    for start in ("subprocess: true", "os.system: true", "multiprocessing: "):
        assert start in out, out
    assert "git -C" not in out, out
    assert "changed this process's LOCAL_RANK from None to '1'" in out, out
    assert "2 assert statements passed" in out, out  # one per test that passed its assert, the loop's once


def test_a_process_a_module_fixture_left_in_a_session_of_its_own_is_killed_when_the_module_ends(pytester,
                                                                                                monkeypatch):
    tag = uuid.uuid4().hex
    monkeypatch.setenv("HYDRA_DIST_TEST_TAG", tag)
    _suite(pytester, monkeypatch, "runs", LEAVES_A_SERVER)
    try:
        pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
        assert gone_within(tag, 10) == [], "the module fixture's server outlived its module"
    finally:
        kill_tagged(tag, "HYDRA_DIST_TEST_TAG")
