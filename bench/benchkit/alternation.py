"""Run variants in alternation (A, B, A, B, ...) so that machine noise hits every variant alike."""
from __future__ import annotations

import time
from statistics import median
from typing import Callable


def alternate(variants: dict[str, Callable[[], dict]], repeats: int) -> dict[str, list[dict]]:
    samples: dict[str, list[dict]] = {name: [] for name in variants}
    for round_no in range(1, repeats + 1):
        for name, measure in variants.items():
            sample = measure()
            samples[name].append(sample)
            shown = ", ".join(f"{k}={_short(v)}" for k, v in sample.items() if isinstance(v, (int, float)))
            print(f"  round {round_no}/{repeats} {name}: {shown}", flush=True)
    return samples


def seconds_for(step: Callable[[], None], calls: int) -> float:
    """Wall time of `calls` calls of one in-process step."""
    start = time.perf_counter()
    for _ in range(calls):
        step()
    return time.perf_counter() - start


def alternate_steps_per_sec(steps: dict[str, Callable[[], None]], calls: int, repeats: int) -> dict[str, list[dict]]:
    """In-process variants in alternation: each sample is {"steps_per_sec": ...} over `calls` steps."""
    return alternate({name: (lambda step=step: {"steps_per_sec": calls / seconds_for(step, calls)})
                      for name, step in steps.items()}, repeats)


def median_of(samples: list[dict], key: str) -> float | None:
    values = [s[key] for s in samples if s.get(key) is not None]
    return median(values) if values else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
