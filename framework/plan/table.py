"""The plan as people read it: one line per row (per rank: each kind of memory, the peak, whether it fits the GPU),
then the verdict (the rows that fit, fewest workers first; the strategies none of whose rows fit; each strategy's
largest micro-batch that fits); and as plan.json."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from framework.plan.gpus import Gpu
from framework.plan.rows import Row

MIB = 2 ** 20
COLUMNS = ("parameters", "gradients", "optimizer", "activations", "temporaries", "buffers", "batch", "peak")


def table(rows: list[Row], gpu: Gpu | None, largest: dict[str, Row | None]) -> str:
    unit, size = _unit(rows)
    head = ["strategy", "workers", "micro-batch", *COLUMNS, "fits" if gpu else "", "s"]
    lines = [head]
    for row in rows:
        lines.append([row.strategy, str(row.workers), str(row.micro_batch),
                      *(f"{getattr(row, c) / size:.1f}" for c in COLUMNS), _fits(row, gpu), f"{row.seconds:.1f}"])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(v.rjust(w) if i > 0 else v.ljust(w) for i, (v, w) in enumerate(zip(line, widths))).rstrip()
            for line in lines]
    where = (f"{gpu.name} ({gpu.memory / 2 ** 30:.0f} GiB) less its device constants (estimates, docs/plan.md)"
             if gpu else "no GPU here (name one: plan.gpu=H100-80GB)")
    return "\n".join([f"{unit} per rank, at the peak of a training step; compared with " + where, *text,
                      *verdict(rows, gpu), *largest_lines(largest, gpu)])


def verdict(rows: list[Row], gpu: Gpu | None) -> list[str]:
    if gpu is None:
        return []
    fitting = sorted((r for r in rows if gpu.fits(r.peak, r.workers)), key=lambda r: (r.workers, r.peak))
    if not fitting:
        return [f"nothing fits {gpu.name}"]
    fewest = fitting[0].workers
    lines = ["fits with the fewest workers: " + ", ".join(f"{r.strategy} x {r.workers}" for r in fitting
                                                          if r.workers == fewest)]
    missing = sorted({r.strategy for r in rows} - {r.strategy for r in fitting})
    if missing:
        lines.append("does not fit on any of these worker counts: " + ", ".join(missing))
    return lines


def largest_lines(largest: dict[str, Row | None], gpu: Gpu | None) -> list[str]:
    lines = []
    for name, row in largest.items():
        lines.append(f"{name}: not one sample fits {gpu.name}" if row is None else
                     f"{name} x {row.workers}: up to {row.micro_batch} samples per GPU at a time fit "
                     f"(peak {_mib(row.peak)} MiB; trainer.batch_size={row.micro_batch} x data-parallel ranks x "
                     "grad_accum)")
    return lines


def write_json(rows: list[Row], gpu: Gpu | None, largest: dict[str, Row | None], path: Path) -> None:
    """Bytes, not MiB; `fits` null where there is no GPU to compare with; `largest_micro_batch`: per strategy, the
    row planned at the largest micro-batch that fits (null: not one sample)."""
    plan = {"gpu": dataclasses.asdict(gpu) if gpu else None,
            "rows": [{**dataclasses.asdict(r), "fits": gpu.fits(r.peak, r.workers) if gpu else None} for r in rows],
            "largest_micro_batch": {name: dataclasses.asdict(r) if r else None for name, r in largest.items()}}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(plan, indent=1))
    tmp.replace(path)


def _unit(rows: list[Row]) -> tuple[str, int]:
    """MiB, or KiB for a model so small that its rows would read 0.0 MiB."""
    return ("MiB", MIB) if max((r.peak for r in rows), default=0) >= MIB else ("KiB", 2 ** 10)


def _mib(n: int) -> str:
    return f"{n / MIB:.1f}"


def _fits(row: Row, gpu: Gpu | None) -> str:
    if gpu is None:
        return ""
    return "yes" if gpu.fits(row.peak, row.workers) else "no"
