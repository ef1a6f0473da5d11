"""A benchmark's round that fails (bench/benchkit/alternation.py: RoundFailed, e.g. the torchrun script aborting at
teardown after its step) is measured once more, then recorded as failed, and the rounds before and after it are kept
and written as they come (bench/startup.py). In this process: the rounds are functions, not commands."""
from __future__ import annotations

import importlib.util

from support.processes import REPO

BENCH = REPO / "bench"


def _flaky(outcomes):
    """A measurement whose calls give these outcomes in turn: a number of seconds, or why it failed."""
    from benchkit.alternation import RoundFailed

    given = iter(outcomes)

    def measure() -> dict:
        outcome = next(given)
        if isinstance(outcome, str):
            raise RoundFailed(outcome)
        return {"whole_run": outcome}
    return measure


def test_a_failed_round_is_tried_again_then_counted_as_failed_and_every_other_round_is_kept(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from benchkit.alternation import alternate

    flaky = _flaky(["exit code 1", 2.0, "exit code -6", "exit code -6, after its first step", 4.0])
    written = []
    samples = alternate({"torchrun": flaky, "train.py": _flaky([1.0, 1.5, 1.2])}, 3, retries=1,
                        after_each=lambda so_far: written.append({name: len(s) for name, s in so_far.items()}))
    assert samples["torchrun"] == [{"whole_run": 2.0, "retried_after": ["exit code 1"]},
                                   {"failed": "exit code -6, after its first step", "attempts": 2},
                                   {"whole_run": 4.0}]
    assert [s["whole_run"] for s in samples["train.py"]] == [1.0, 1.5, 1.2]
    assert [sum(counts.values()) for counts in written] == [1, 2, 3, 4, 5, 6]

    spec = importlib.util.spec_from_file_location("bench_startup", BENCH / "startup.py")
    startup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(startup)
    side = startup.summary_of("ddp", samples)["sides"]["torchrun"]
    assert (side["whole_run"], side["failed_rounds"], side["to_loop"]) == (3.0, 1, None)
