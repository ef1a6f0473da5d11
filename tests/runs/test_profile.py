"""trainer.profile: torch.profiler traces of the chosen steps on every rank of a real ddp run (2 gloo workers),
each rank's time split into computation, communication and idle, printed and in TensorBoard."""
import json
import re

import pytest

from framework.telemetry.trace_breakdown import breakdown_of, is_collective
from support.processes import TINY
from support.run_files import read_scalars

FIRST, LAST = 5, 8


def _step_spans(trace: dict) -> list[tuple[float, float]]:
    return [(e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("train step ")]


def _collective_ms_inside(steps: list[tuple[float, float]], trace: dict) -> float:
    """Every collective's time inside the steps, on any thread (what the breakdown may count, before overlap)."""
    return sum(min(e["ts"] + e["dur"], end) - max(e["ts"], start) for e in trace["traceEvents"]
               if e.get("ph") == "X" and "dur" in e and is_collective(e)
               for start, end in steps if e["ts"] < end and e["ts"] + e["dur"] > start) / 1e3


def test_profiled_steps_give_a_trace_per_rank_and_a_breakdown_that_sums_to_the_step_time(runs):
    run = runs.train(["strategy=ddp", *TINY, "trainer.max_steps=12", f"trainer.profile=[{FIRST},{LAST}]"]).ok()
    out, run_dir = run.stdout, run.run_dir
    # a healthy run: the stall watchdog ran (default trainer.stall_timeout) and left nothing behind
    assert not (run_dir / "stall").exists() and not (run_dir / ".heartbeat").exists()
    assert f"profile of steps {FIRST}-{LAST} (traces: {run_dir / 'profile'}/rank<r>.trace.json)" in out
    scalars = read_scalars(run_dir)
    exposed_communication = []
    for rank in (0, 1):
        trace_file = run_dir / "profile" / f"rank{rank}.trace.json"
        trace = json.loads(trace_file.read_text())
        steps = _step_spans(trace)
        spans = [(end - start) / 1e3 for start, end in steps]
        assert len(spans) == LAST - FIRST + 1
        assert any(e.get("name", "").startswith("gloo:") for e in trace["traceEvents"]), "gloo's collectives traced"
        line = re.search(rf"rank {rank}: ([\d.]+) ms/step = computation ([\d.]+) \(\d+%\) \+ communication ([\d.]+) "
                         rf"\(\d+%\) \+ idle ([\d.]+) \(\d+%\) on the CPU timeline, 4 step\(s\)", out)
        assert line, out
        step, parts = float(line.group(1)), [float(line.group(i)) for i in (2, 3, 4)]
        assert sum(parts) == pytest.approx(step, rel=0.1, abs=0.2)
        assert step == pytest.approx(sum(spans) / len(spans), rel=0.1)  # the trace's own step ranges
        assert parts[0] > 0  # LeNet computes
        exposed_communication.append((breakdown_of(trace_file).communication_ms,  # unrounded
                                      _collective_ms_inside(steps, trace)))
        logged = {name: scalars[f"profile/{name}_ms/rank{rank}"] for name in
                  ("step", "computation", "communication", "idle")}
        assert all(values[0][0] == LAST for values in logged.values())
        assert logged["step"][0][1] == pytest.approx(sum(v[0][1] for k, v in logged.items() if k != "step"), rel=0.1)
    # DDP all-reduces its gradients inside the profiled steps on both ranks; how much of that the training thread
    # waits for (the exposed part) depends on the machine's load and can be 0.0 on both ranks when backward hides it
    # (CI saw it), so the run's claim is that the collectives fall inside the steps and the breakdown never counts
    # more than them; the exposed-only arithmetic is pinned in tests/unit/test_profile.py
    for rank, (exposed, inside) in enumerate(exposed_communication):
        assert inside > 0, f"rank {rank}: no collective inside the profiled steps"
        assert 0 <= exposed <= inside + 1e-6
