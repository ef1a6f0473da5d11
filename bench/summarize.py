"""Print the results table of bench/README.md from bench/results/*.json (paste it over the old one).

    .venv/bin/python bench/summarize.py
"""
from __future__ import annotations

import argparse
import json

from benchkit.report import RESULTS


def _f(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def overhead(r: dict, settings: dict) -> list[list[str]]:
    return [[f"overhead, {mode} ({m['processes']} x {m['threads_per_process']} threads)",
             f"{_f(m['framework_steps_per_sec'], 1)} vs {_f(m['baseline_steps_per_sec'], 1)} steps/s",
             f"ratio {_f(m['ratio'], 3)}", ">= 0.98"] for mode, m in r.items()]


def time_to_accuracy(r: dict, settings: dict) -> list[list[str]]:
    overrides = f" ({' '.join(settings['override'])})" if settings.get("override") else ""
    return [[f"time to {r['target']} test accuracy{overrides}",
             f"{_f(r['train_py_seconds'], 0)} s (train.py) vs {_f(r['tutorial_seconds'], 0)} s (tutorial)",
             f"speed-up {_f(r['speedup'])}x", ">= 5x"]]


def strategies(r: dict, settings: dict) -> list[list[str]]:
    reference = next(iter(r))
    batch = f", batch {settings.get('batch_size')} per process" if settings.get("batch_per_process") else ""
    rows = []
    for name, s in r.items():
        per_rank = ", ".join(f"{v:,.0f}" for v in s["per_rank_samples_per_sec"])
        target = ">= 1.7x" if name == "ddp" and reference.startswith("single") else ""
        rows.append([f"strategy {name}{batch}", f"{_f(s['samples_per_sec'], 0)} samples/s (per rank: {per_rank})",
                     f"{_f(s[f'speedup_over_{reference}'])}x {reference}", target])
    return rows


def startup(r: dict, settings: dict) -> list[list[str]]:
    rows = []
    for mode, m in r.items():
        ours = m["sides"]["train.py"]
        baseline_name, baseline = next((n, s) for n, s in m["sides"].items() if n != "train.py")
        rows.append([f"startup, {mode}", f"{_f(ours['to_first_step'])} s to first step (loop at {_f(ours['to_loop'])} s)",
                     f"{baseline_name}: {_f(baseline['to_first_step'])} s", f"<= {m['target_seconds']:g} s"])
    return rows


def speedups(r: dict, settings: dict) -> list[list[str]]:
    return [[f"speed-ups, {model} {variant}", f"{_f(v['samples_per_sec'], 0)} samples/s",
             f"{_f(v['speedup_over_plain'])}x plain", ""] for model, variants in r.items() for variant, v in variants.items()]


def replica_timing(r: dict, settings: dict) -> list[list[str]]:
    return [[f"dp per-replica timing, {model} (in one process)",
             f"{_f(m['timed_steps_per_sec'], 1)} timed vs {_f(m['plain_steps_per_sec'], 1)} plain steps/s",
             f"ratio {_f(m['ratio'], 3)}, {_f(m['added_us_per_step'], 0)} us/step", ">= 0.98"]
            for model, m in r.items()]


def provenance(r: dict, settings: dict) -> list[list[str]]:
    return [[f"provenance record per run, project: {name} (issue 33)",
             f"{_f(m['median_ms'], 0)} ms (first {_f(m['first_ms'], 0)} ms)",
             f"{_f(100 * m['share_of_run'], 1)}% of a {_f(m['whole_run_s'])} s single run" if m["share_of_run"] else "-",
             ""] for name, m in r.items()]


def invariant(r: dict, settings: dict) -> list[list[str]]:
    return [[f"trainer.invariant, {name} (issue 58)", f"{_f(v['step_ms'], 1)} ms/step, {v['bytes_per_step']:,} bytes/step/rank",
             f"{_f(v['step_time_over_plain'])}x plain's time" + (f", {_f(v['bytes_over_plain'], 1)}x its bytes"
                                                                 if v["bytes_over_plain"] else ""), ""]
            for name, v in r.items() if not name.endswith("plain")]


TABLES = {"overhead": overhead, "time_to_accuracy": time_to_accuracy, "strategies": strategies,
          "startup": startup, "speedups": speedups, "replica_timing": replica_timing,
          "provenance": provenance, "invariant": invariant}


def parse_args(argv=None):
    return argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)


def main() -> None:
    parse_args()
    rows, sources = [], []
    for name, to_rows in TABLES.items():
        for path in sorted(RESULTS.glob(f"{name}*.json")):
            payload = json.loads(path.read_text())
            rows += to_rows(payload["results"], payload["settings"])
            m = payload["machine"]
            sources.append(f"- `{payload['command']}` ({payload['finished']}, {m['cpu']}, {m['cores']} cores, "
                           f"torch {m['torch']}, commit {m['git_commit']}{' + local changes' if m['git_dirty'] else ''})")
    print("| measurement | numbers | result | target |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print("\n".join(sources))


if __name__ == "__main__":
    main()
