"""trainer.profile in this process: a bad range refused in the driver, and the CPU breakdown's arithmetic on a
hand-made trace. Real traces of a ddp run: tests/runs/test_profile.py."""
import json

import pytest

from framework.telemetry.trace_breakdown import breakdown_of
from support.driver import driver_says

FIRST, LAST = 5, 8


def test_a_bad_profile_range_is_refused_in_the_driver(tmp_path):
    assert "trainer.profile=[5, 2] is not allowed: expected [first, last]: two integers with 1 <= first <= last" \
        in driver_says(["trainer.profile=[5,2]"], tmp_path)


def _event(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat}


def test_the_cpu_breakdown_counts_only_exposed_communication_and_the_rest_of_the_step_as_idle(tmp_path):
    """One 100 us step on the training thread (tid 1): operators 0-40, a collective on gloo's thread (tid 2) 30-70
    that the training thread waits for, an operator again 80-90. Computation 50, exposed communication 30 (40-70:
    30-40 overlaps an operator), idle 20."""
    trace = tmp_path / "rank0.trace.json"
    trace.write_text(json.dumps({"traceEvents": [
        _event("train step 1", 0, 100, cat="user_annotation"), _event("aten::conv2d", 0, 40),
        _event("aten::convolution", 5, 30),  # nested: counted once
        _event("c10d::allreduce_", 28, 2), _event("gloo:all_reduce", 30, 40, tid=2, cat="user_annotation"),
        _event("aten::add_", 80, 10), _event("aten::mul", 150, 10),  # after the step: not counted
    ]}))
    b = breakdown_of(trace)
    assert (b.steps, b.timeline) == (1, "CPU")
    assert (b.total_ms, b.computation_ms, b.communication_ms, b.idle_ms) == pytest.approx((0.1, 0.05, 0.03, 0.02))
