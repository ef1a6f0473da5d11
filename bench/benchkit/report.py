"""Print a small table and write bench/results/<name>.json with the settings and the machine."""
from __future__ import annotations

import datetime
import json
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from benchkit.commands import REPO, cpu_cores

RESULTS = REPO / "bench" / "results"


def machine() -> dict:
    import torch

    return {
        "cpu": _cpu_model(),
        "cores": cpu_cores(),
        "gpus": torch.cuda.device_count(),
        "memory_gib": _memory_gib(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "os": platform.platform(),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def print_table(headers: list[str], rows: list[list]) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")


def write_results(name: str, settings: dict, results: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {
        "benchmark": name,
        "command": ".venv/bin/python " + shlex.join(["bench/" + Path(sys.argv[0]).name, *sys.argv[1:]]),
        "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "settings": settings,
        "machine": machine(),
        "results": results,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path.relative_to(REPO)}")
    return path


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}"
    return str(value)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        return round(kib / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return None


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
