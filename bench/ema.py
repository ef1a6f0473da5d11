"""The EMA callback's cost in one process, without process start-up noise: training steps/s of LeNet (batch 64,
SGD) with framework/callbacks/ema.py's EMA updating its average after every optimizer step (as the loop calls
on_train_step_end), against the same steps without it. Rounds alternate; medians and the ratio with / without.
--model mlp: a 4 x 1024 MLP on 784 inputs (3.9M parameters, few FLOPs per parameter: where an average costs most).

    .venv/bin/python bench/ema.py --repeats 7 [--model mlp]
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


def steps_per_second(model_name: str, steps: int, with_ema: bool) -> float:
    torch.manual_seed(0)
    model = build(model_name)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    trainer = SimpleNamespace(wrapped=SimpleNamespace(module=model), evaluation_contexts=[])
    ema = EMA(decay=0.999) if with_ema else None
    if ema:
        ema.on_fit_start(trainer)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if ema:
            ema.on_train_step_end(trainer, step)
    return steps / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("lenet", "mlp"), default="lenet")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    steps_per_second(args.model, 20, True)  # warm-up
    plain, averaged = [], []
    for _ in range(args.repeats):
        plain.append(steps_per_second(args.model, args.steps, False))
        averaged.append(steps_per_second(args.model, args.steps, True))
        print(f"  plain {plain[-1]:.1f}  with ema {averaged[-1]:.1f} steps/s", flush=True)
    a, b = statistics.median(averaged), statistics.median(plain)
    print(f"\n{args.model}: with ema {a:.1f} vs without {b:.1f} steps/s: ratio {a / b:.3f}; "
          f"{1000 / a - 1000 / b:.2f} ms per step")
    write_results(f"ema_{args.model}", vars(args), {"plain_steps_per_sec": plain, "ema_steps_per_sec": averaged,
                                                    "ratio": a / b})


if __name__ == "__main__":
    main()
