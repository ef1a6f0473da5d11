"""Run variants in alternation (A, B, A, B, ...) so that machine noise hits every variant alike. A variant's round
that fails (RoundFailed: its command exited non-zero) is measured again, then recorded as failed, and the other
rounds and variants go on."""
from __future__ import annotations

import time
from statistics import median
from typing import Callable


class RoundFailed(RuntimeError):
    """One variant's measurement failed in one round; the message says why in one line."""


def alternate(variants: dict[str, Callable[[], dict]], repeats: int, *, retries: int = 0,
              after_each: Callable[[dict[str, list[dict]]], None] | None = None) -> dict[str, list[dict]]:
    """Every variant's samples, round by round. A measurement that raises RoundFailed is taken again up to `retries`
    times in its round; failing still, its sample is {"failed": why, "attempts": n} (no numbers: median_of skips
    it). after_each(samples so far) runs after every sample, e.g. to write the results as they come."""
    samples: dict[str, list[dict]] = {name: [] for name in variants}
    for round_no in range(1, repeats + 1):
        for name, measure in variants.items():
            sample = measured(measure, retries)
            samples[name].append(sample)
            shown = ", ".join(f"{k}={_short(v)}" for k, v in sample.items() if isinstance(v, (int, float)))
            if "failed" in sample:
                shown = f"failed {sample['attempts']} time(s): {sample['failed']}"
            print(f"  round {round_no}/{repeats} {name}: {shown}", flush=True)
            if after_each is not None:
                after_each(samples)
    return samples


def measured(measure: Callable[[], dict], retries: int = 0) -> dict:
    """measure()'s sample; a RoundFailed taken again up to `retries` times, then recorded as the sample. A sample
    that needed a second try says what the first ones met (retried_after)."""
    failures = []
    for _ in range(retries + 1):
        try:
            sample = measure()
        except RoundFailed as why:
            failures.append(str(why))
            print(f"    failed: {why}", flush=True)
            continue
        return {**sample, "retried_after": failures} if failures else sample
    return {"failed": failures[-1], "attempts": len(failures)}


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
