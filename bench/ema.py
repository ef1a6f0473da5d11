"""The EMA callback's cost in one process, without process start-up noise: training steps/s of LeNet (batch 64,
SGD) with framework/callbacks/ema.py's EMA updating its average after every optimizer step (as the loop calls
on_train_step_end), against the same steps without it. Rounds alternate; medians and the ratio with / without, the best rounds' ratio,
and the update alone per call (the fastest round's: least disturbed by other processes on a shared machine).
--model mlp: a 4 x 1024 MLP on 784 inputs (3.9M parameters, few FLOPs per parameter: where an average costs most).

    .venv/bin/python bench/ema.py --repeats 7 [--model mlp] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from framework.callbacks.ema import EMA  # noqa: E402
from framework.models.lenet import LeNet  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit.report import write_results  # noqa: E402


def build(model: str) -> nn.Module:
    if model == "lenet":
        return LeNet((1, 28, 28), 10)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def setup(model_name: str, with_ema: bool):
    torch.manual_seed(0)
    model = build(model_name)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = SimpleNamespace(model=model, evaluate_inside=lambda context: None)  # what the EMA uses of LoopState
    ema = EMA(decay=0.999) if with_ema else None
    if ema:
        ema.on_fit_start(state)
    return model, optimizer, state, ema


def steps_per_second(model_name: str, steps: int, with_ema: bool) -> float:
    model, optimizer, state, ema = setup(model_name, with_ema)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    start = time.perf_counter()
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if ema:
            ema.on_train_step_end(state, step)
    return steps / (time.perf_counter() - start)


def update_us(model_name: str, calls: int) -> float:
    """The average's update alone (what the callback adds to a step), per call."""
    _, _, state, ema = setup(model_name, True)
    start = time.perf_counter()
    for step in range(calls):
        ema.on_train_step_end(state, step)
    return (time.perf_counter() - start) / calls * 1e6


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("lenet", "mlp"), default="lenet")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    steps_per_second(args.model, 20, True)  # warm-up
    plain, averaged, updates = [], [], []
    for _ in range(args.repeats):
        plain.append(steps_per_second(args.model, args.steps, False))
        averaged.append(steps_per_second(args.model, args.steps, True))
        updates.append(update_us(args.model, args.steps))
        print(f"  plain {plain[-1]:.1f}  with ema {averaged[-1]:.1f} steps/s; one update {updates[-1]:.0f} us",
              flush=True)
    a, b, u = statistics.median(averaged), statistics.median(plain), min(updates)
    best_a, best_b = max(averaged), max(plain)
    print(f"\n{args.model}: with ema {a:.1f} vs without {b:.1f} steps/s (medians): ratio {a / b:.3f}; best rounds "
          f"{best_a:.1f} vs {best_b:.1f}: ratio {best_a / best_b:.3f}; one update {u:.0f} us (fastest round) = "
          f"{100 * u / 1e6 * best_b:.1f}% of the fastest plain step")
    write_results(f"ema_{args.model}", vars(args), {"plain_steps_per_sec": plain, "ema_steps_per_sec": averaged,
                                                    "update_us": updates, "ratio": a / b,
                                                    "best_ratio": best_a / best_b})


if __name__ == "__main__":
    main()
