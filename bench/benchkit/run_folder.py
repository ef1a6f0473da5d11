"""What a finished train.py run left behind: its run folder, result.json and TensorBoard scalars."""
from __future__ import annotations

import json
from pathlib import Path
from statistics import median


def only_run_folder(workdir: Path) -> Path:
    """train.py was started with cwd=workdir, so its single run folder is under workdir/outputs."""
    folders = sorted(p.parent for p in (workdir / "outputs").rglob(".hydra"))
    if len(folders) != 1:
        raise RuntimeError(f"expected one run folder under {workdir / 'outputs'}, found {len(folders)}")
    return folders[0]


def read_result(run_folder: Path) -> dict:
    return json.loads((run_folder / "result.json").read_text())


def tensorboard_scalars(run_folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def steady_throughput(scalars: dict[str, list[tuple[int, float]]]) -> dict:
    """Median samples/s over the logged intervals after the first one (the first holds the warm-up),
    for the whole job and for each rank."""
    def steady(tag: str) -> float:
        values = [v for _, v in scalars[tag]]
        return median(values[1:] if len(values) > 1 else values)

    ranks = sorted((t for t in scalars if t.startswith("throughput/samples_per_sec/rank")),
                   key=lambda t: int(t.rsplit("rank", 1)[1]))
    return {
        "samples_per_sec": steady("throughput/samples_per_sec"),
        "per_rank_samples_per_sec": [steady(t) for t in ranks],
        "intervals": len(scalars["throughput/samples_per_sec"]),
    }
