"""The session's run cache (support/run_cache.py) in this process, with starts that stand for a run's command: a run
stopped by its timeout is recorded once, and every later reader fails at once with what stopped it; a run never
inherits a rank's variables from the test process."""
from subprocess import CompletedProcess, TimeoutExpired

import pytest

from support.run_cache import RunCache


def _stopped_by(exc: BaseException, started: list):
    """A start that is stopped as a hanging run is: its command's timeout, or the test's (pytest-timeout's signal
    method raises pytest's Failed in the waiting thread), with the output run_in_own_session adds."""

    def start(cwd):
        started.append(cwd)
        exc.add_note("stdout:\nstep 3 of 40\nstderr:\n")
        raise exc

    return start


@pytest.mark.parametrize("stop", [
    TimeoutExpired(["train.py"], 600),
    pytest.fail.Exception("Timeout (>900.0s) from pytest-timeout."),
], ids=["command_timeout", "test_timeout"])
def test_a_stopped_shared_run_is_started_once_and_later_readers_fail_at_once_with_its_output(tmp_path, stop):
    cache, started = RunCache(tmp_path), []
    with pytest.raises(type(stop)):
        cache._once("hangs", _stopped_by(stop, started))
    for _ in range(2):
        with pytest.raises(pytest.fail.Exception) as later:
            cache._once("hangs", _stopped_by(stop, started))
        assert "was stopped in an earlier test" in str(later.value), later.value
        assert "step 3 of 40" in str(later.value) and type(stop).__name__ in str(later.value), later.value
    assert len(started) == 1, "a later reader started the stopped run again"


def test_a_finished_shared_run_is_read_by_every_later_caller(tmp_path):
    cache, started = RunCache(tmp_path), []

    def start(cwd):
        started.append(cwd)
        return CompletedProcess(["train.py"], 0, "done\n", "")

    readers = [cache._once("finishes", start) for _ in range(3)]
    assert len(started) == 1 and {(r.cwd, r.returncode, r.stdout) for r in readers} == {(started[0], 0, "done\n")}


def test_a_shared_run_does_not_inherit_a_rank_s_variables_from_the_test_process(tmp_path, monkeypatch):
    """The cache's key holds the test's own env= only: a LOCAL_RANK one test leaked would decide every later run."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(pytest.fail.Exception, match=r"would inherit \{'LOCAL_RANK': '1'\} from the test process"):
        RunCache(tmp_path).train(["strategy=single"], timeout=1)  # without the refusal: a run, stopped at once
