"""The stall watchdog's cost in one process, without process start-up noise: training steps/s of LeNet (batch 64,
SGD) three ways, in alternating rounds:

plain:   the steps without heartbeats or watchdog;
watched: the loop's heartbeats (five Heartbeat.beat calls per step, the batch given at "compute", as
         framework/training/trainer.py makes them) and a StallWatchdog thread writing its position file (tick 0.2 s,
         25x more often than the default's 5 s);
slow:    the watchdog's hardest case: one heartbeat, then every step of the round as one slow batch past the timeout
         (1 s): the thread samples the loop's thread in full every tick (its CPU clock, /proc state and Python
         stack), judges it each tick, and says "slow, not stalled" once a timeout.

Medians and the ratios watched / plain and slow / plain (target >= 0.99 both); the cost of one beat and of one full
sample (the watchdog's thread, which holds the GIL for part of it).

    .venv/bin/python bench/stall_watchdog.py --repeats 7
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from framework.models.lenet import LeNet  # noqa: E402
from framework.telemetry.activity import ActivityWindow  # noqa: E402
from framework.telemetry.stall import Heartbeat, StallSeat, StallWatchdog  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit.report import write_results  # noqa: E402


def steps_per_second(steps: int, heartbeat: Heartbeat | None, beats: bool = True) -> float:
    """beats=False: the heartbeat beats once, before the first step (the round is one slow batch)."""
    torch.manual_seed(0)
    model = LeNet((1, 28, 28), 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    beating = heartbeat if beats else None
    if heartbeat and not beats:
        heartbeat.beat(1, "compute", x)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        if beating:
            beating.beat(step, "data")
            beating.beat(step, "compute", x)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if beating:
            beating.beat(step, "step_end")
            beating.beat(step, "log")
            beating.beat(step, "checkpoint")
    return steps / (time.perf_counter() - start)


def watched_steps_per_second(run_dir: Path, steps: int, timeout: float, beats: bool, said: list) -> float:
    heartbeat = Heartbeat()
    watchdog = StallWatchdog(heartbeat, StallSeat(run_dir, 0, 1), timeout=timeout, say=said.append,
                             last_checkpoint=lambda: None, prints_summary=True).start()
    try:
        return steps_per_second(steps, heartbeat, beats)
    finally:
        watchdog.stop()


def per_call_ns(call, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e9


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=7)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    steps_per_second(20, None)  # warm-up
    plain, watched, slow, said = [], [], [], []
    with tempfile.TemporaryDirectory() as run_dir:
        for _ in range(args.repeats):
            plain.append(steps_per_second(args.steps, None))
            watched.append(watched_steps_per_second(Path(run_dir), args.steps, 4.0, True, said))
            slow.append(watched_steps_per_second(Path(run_dir), args.steps, 1.0, False, said))
            print(f"  plain {plain[-1]:.1f}  watched {watched[-1]:.1f}  slow step {slow[-1]:.1f} steps/s", flush=True)
    a, b, c = statistics.median(watched), statistics.median(plain), statistics.median(slow)
    beat = Heartbeat()
    x = torch.zeros(64, 1, 28, 28)
    beat_ns = per_call_ns(lambda: beat.beat(1, "compute", x), 1_000_000)
    window = ActivityWindow(None, 60.0)
    sample_us = per_call_ns(lambda: window.sample(time.monotonic(), full=True), 20_000) / 1e3
    slow_lines = sum(1 for line in said if " is slow, not stalled: " in line)
    print(f"\nwith watchdog {a:.1f} vs without {b:.1f} steps/s: ratio {a / b:.3f} (>= 0.99); in a slow step "
          f"{c:.1f}: ratio {c / b:.3f} (>= 0.99; {slow_lines} 'slow' lines said)\none Heartbeat.beat {beat_ns:.0f} ns, "
          f"5 per step = {5 * beat_ns / 1e3:.2f} us = {100 * 5 * beat_ns / 1e9 * b:.4f}% of a step; one full sample "
          f"{sample_us:.1f} us, on the watchdog's thread every tick (0.2 s here, 5 s by default)")
    write_results("stall_watchdog", vars(args), {
        "plain_steps_per_sec": plain, "watched_steps_per_sec": watched, "slow_step_steps_per_sec": slow,
        "ratio": a / b, "slow_ratio": c / b, "beat_ns": beat_ns, "full_sample_us": sample_us,
        "slow_lines": slow_lines})


if __name__ == "__main__":
    main()
