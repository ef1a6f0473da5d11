"""Read training progress out of output lines. train.py and the baselines print the same markers:
'training ...' right before the loop, '... step S/T ...' every log interval, '... test accuracy A' after
each evaluation."""
from __future__ import annotations

import re

STEP = re.compile(r"\bstep (\d+)/(\d+)\b")
TEST_ACCURACY = re.compile(r"\btest accuracy (\d+(?:\.\d+)?)")
EPOCH = re.compile(r"\bepoch (\d+)")


def step_times(lines: list[tuple[float, str]]) -> dict[int, float]:
    """Step number -> seconds (since the command started) at which its progress line appeared."""
    times = {}
    for t, line in lines:
        m = STEP.search(line)
        if m:
            times.setdefault(int(m.group(1)), t)
    return times


def training_start_time(lines: list[tuple[float, str]]) -> float | None:
    return next((t for t, line in lines if line.startswith("training ")), None)


def accuracy_of(line: str) -> float | None:
    m = TEST_ACCURACY.search(line)
    return float(m.group(1)) if m else None


def evaluations(lines: list[tuple[float, str]]) -> list[dict]:
    """Every test-accuracy line: seconds since start, epoch, accuracy."""
    found = []
    for t, line in lines:
        acc = accuracy_of(line)
        if acc is not None:
            epoch = EPOCH.search(line)
            found.append({"seconds": t, "epoch": int(epoch.group(1)) if epoch else None, "test_acc": acc})
    return found


def steps_per_second(lines: list[tuple[float, str]], first_step: int, last_step: int) -> float:
    """(last_step - first_step) / time between their progress lines: warm-up and startup excluded."""
    times = step_times(lines)
    missing = [s for s in (first_step, last_step) if s not in times]
    if missing:
        raise RuntimeError(f"no progress line for step(s) {missing}; steps seen: {sorted(times)[:10]}...")
    return (last_step - first_step) / (times[last_step] - times[first_step])
