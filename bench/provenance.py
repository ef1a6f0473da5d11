"""What the provenance record adds to every run: the time of framework/results/provenance.py's collect() + start()
(git state of the project and of hydra-dist, versions, packages, host, GPUs, env; provenance.json and the patches
written), exactly what the driver calls once per run, timed in one process so start-up noise stays out. Two
projects: this repository (a git checkout; hydra-dist is the same repository) and a folder without git (then
hydra-dist's own checkout is read). The first call is timed apart (cold caches), then medians of --repeats; the
share is of the whole `train.py strategy=single` run of bench/results/startup.json.

    .venv/bin/python bench/provenance.py --repeats 20
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from framework.results.provenance import collect, start  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit.commands import REPO  # noqa: E402
from benchkit.report import RESULTS, write_results  # noqa: E402


def one_record(project: Path, folder: Path) -> float:
    started = time.perf_counter()
    start(folder, collect(sys.argv, ["strategy=single"], project))
    return time.perf_counter() - started


def whole_single_run() -> float | None:
    try:
        startup = json.loads((RESULTS / "startup.json").read_text())
        return startup["results"]["single"]["sides"]["train.py"]["whole_run"]
    except (OSError, KeyError, ValueError):
        return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    whole = whole_single_run()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        no_git = Path(tmp) / "project"
        no_git.mkdir()
        for name, project in (("git checkout", REPO), ("no git", no_git)):
            folders = [Path(tmp) / f"{name}-{i}" for i in range(args.repeats + 1)]
            for folder in folders:
                folder.mkdir()
            first = one_record(project, folders[0])
            seconds = [one_record(project, folder) for folder in folders[1:]]
            median = statistics.median(seconds)
            results[name] = {"first_ms": first * 1e3, "median_ms": median * 1e3, "samples_ms": [s * 1e3 for s in seconds],
                             "whole_run_s": whole, "share_of_run": median / whole if whole else None}
            share = f" = {100 * median / whole:.1f}% of a {whole:.2f} s single run" if whole else ""
            print(f"{name}: first {first * 1e3:.0f} ms, then median {median * 1e3:.0f} ms{share}", flush=True)
    write_results("provenance", vars(args), results)


if __name__ == "__main__":
    main()
