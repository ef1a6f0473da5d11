"""The stall watchdog's cost in one process, without process start-up noise: training steps/s of LeNet (batch 64,
SGD) with the loop's heartbeats (five Heartbeat.beat calls per step, as framework/training/trainer.py makes them)
and a StallWatchdog thread writing its position file (tick 0.2 s, 25x more often than the default's 5 s), against
the same steps without either. Rounds alternate; medians and the ratio with / without (target >= 0.99).

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
from framework.telemetry.stall import Heartbeat, StallSeat, StallWatchdog  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit.report import write_results  # noqa: E402


def steps_per_second(steps: int, heartbeat: Heartbeat | None) -> float:
    torch.manual_seed(0)
    model = LeNet((1, 28, 28), 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    start = time.perf_counter()
    for step in range(1, steps + 1):
        if heartbeat:
            heartbeat.beat(step, "data")
            heartbeat.beat(step, "compute")
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if heartbeat:
            heartbeat.beat(step, "step_end")
            heartbeat.beat(step, "log")
            heartbeat.beat(step, "checkpoint")
    return steps / (time.perf_counter() - start)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=7)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    steps_per_second(20, None)  # warm-up
    plain, watched = [], []
    with tempfile.TemporaryDirectory() as run_dir:
        for _ in range(args.repeats):
            plain.append(steps_per_second(args.steps, None))
            heartbeat = Heartbeat()
            watchdog = StallWatchdog(heartbeat, StallSeat(Path(run_dir), 0, 1), timeout=4.0, say=print,
                                     last_checkpoint=lambda: None, prints_summary=True).start()
            try:
                watched.append(steps_per_second(args.steps, heartbeat))
            finally:
                watchdog.stop()
            print(f"  plain {plain[-1]:.1f}  watched {watched[-1]:.1f} steps/s", flush=True)
    a, b = statistics.median(watched), statistics.median(plain)
    beat = Heartbeat()
    n = 1_000_000
    t = time.perf_counter()
    for i in range(n):
        beat.beat(i, "data")
    per_beat_ns = (time.perf_counter() - t) / n * 1e9
    print(f"\nwith watchdog {a:.1f} vs without {b:.1f} steps/s: ratio {a / b:.3f} (>= 0.99); "
          f"one Heartbeat.beat {per_beat_ns:.0f} ns, 5 per step = {5 * per_beat_ns / 1e3:.2f} us "
          f"= {100 * 5 * per_beat_ns / 1e9 * b:.4f}% of a step")
    write_results("stall_watchdog", vars(args), {"plain_steps_per_sec": plain, "watched_steps_per_sec": watched,
                                                 "ratio": a / b, "beat_ns": per_beat_ns})


if __name__ == "__main__":
    main()
