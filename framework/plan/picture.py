"""plan.png: one stacked bar per row (parameters, gradients, optimizer, activations, temporaries and the batch,
buffers), the GPU's memory as a line and, per row, what its tensors may take (the memory less the device
constants) as a mark; matplotlib is an optional package (the `plot` extra)."""
from __future__ import annotations

from pathlib import Path

from framework.plan.gpus import Gpu
from framework.plan.rows import Row

MIB = 2 ** 20
STACK = ("parameters", "gradients", "optimizer", "activations", "temporaries", "batch", "buffers")


def write_png(rows: list[Row], gpu: Gpu | None, path: Path) -> str:
    """The picture at `path`; returns the line to print (where it is, or why there is none)."""
    try:
        # optional: the plan's table and plan.json need no plotting package
        import matplotlib
    except ImportError:
        return "plan.png: not drawn (matplotlib is not installed: pip install 'hydra-dist[plot]')"
    matplotlib.use("Agg")
    from matplotlib import pyplot  # after the backend is chosen: no display needed

    figure, axes = pyplot.subplots(figsize=(max(4.0, 1.0 + 0.8 * len(rows)), 4.0))
    names = [f"{r.strategy}\nx{r.workers}" for r in rows]
    bottom = [0.0] * len(rows)
    for part in STACK:
        heights = [getattr(r, part) / MIB for r in rows]
        axes.bar(names, heights, bottom=bottom, label=part)
        bottom = [b + h for b, h in zip(bottom, heights)]
    if gpu is not None:
        axes.axhline(gpu.memory / MIB, color="black", linestyle="--", label=gpu.name)
        axes.scatter(names, [gpu.room(r.workers) / MIB for r in rows], marker="_", s=800, color="black",
                     label="less device constants")
    axes.set_ylabel("MiB per rank at the step's peak")
    axes.legend(fontsize="small")
    figure.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    figure.savefig(tmp)
    pyplot.close(figure)
    tmp.replace(path)
    return f"plan.png: {path}"
