"""The commands the benchmarks compare: the real train.py, and the hand-written baselines in bench/baselines/
(run as a user would run them: plain python, or torchrun for the DDP script)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN_PY = REPO / "train.py"
BASELINES = REPO / "bench" / "baselines"
PYTHON = sys.executable
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def environment(threads_per_process: int | None) -> dict[str, str]:
    """The environment every side runs in. threads_per_process=None leaves thread counts to each program's
    own defaults (what a user gets); a number sets OMP_NUM_THREADS for both sides alike."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONUNBUFFERED"] = "1"
    if threads_per_process is not None:
        env["OMP_NUM_THREADS"] = str(threads_per_process)
    return env


def train_py(*overrides: str, repo: Path = REPO) -> list[str]:
    """train.py of this checkout, or of another one (its own framework package is imported: train.py's folder
    comes first on the path)."""
    return [PYTHON, str(repo / "train.py"), *overrides]


def baseline(script: str, *args: str) -> list[str]:
    return [PYTHON, str(BASELINES / script), *args]


def torchrun(script: str, nproc: int, *args: str) -> list[str]:
    """`torchrun --standalone --nproc_per_node=N script args`, through the venv's python."""
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            str(BASELINES / script), *args]
