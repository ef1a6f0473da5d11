"""The model at a glance, as Lightning's ModelSummary shows it: parameters per top-level module (the model's direct
children; the model's own parameters as `(own)`), trainable and frozen, with totals. Rank 0 prints it at the start
of training (console and train.log) and writes it to TensorBoard's Text tab (tag model/summary)."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass
class ModuleRow:
    name: str
    kind: str  # the module's class
    trainable: int
    frozen: int


def _numel(p) -> int:
    # DeepSpeed ZeRO-3 leaves a 0-element placeholder on every rank and records the real size as ds_numel
    return int(getattr(p, "ds_numel", p.numel()))


def _count(params) -> tuple[int, int]:
    trainable = frozen = 0
    for p in params:
        if p.requires_grad:
            trainable += _numel(p)
        else:
            frozen += _numel(p)
    return trainable, frozen


def summarize(model: nn.Module) -> list[ModuleRow]:
    """One row per direct child with parameters (shared ones counted where first met), and the model's own."""
    rows, seen = [], set()
    for name, child in model.named_children():
        params = [p for p in child.parameters() if id(p) not in seen]
        seen.update(id(p) for p in params)
        if params:
            rows.append(ModuleRow(name, type(child).__name__, *_count(params)))
    own = [p for p in model.parameters() if id(p) not in seen]
    if own:
        rows.append(ModuleRow("(own)", type(model).__name__, *_count(own)))
    return rows


def _total(rows: list[ModuleRow]) -> ModuleRow:
    return ModuleRow("total", "", sum(r.trainable for r in rows), sum(r.frozen for r in rows))


def as_lines(rows: list[ModuleRow]) -> list[str]:
    """A fixed-width table for the console and train.log."""
    table = [("module", "type", "trainable", "frozen")]
    table += [(r.name, r.kind, f"{r.trainable:,}", f"{r.frozen:,}") for r in [*rows, _total(rows)]]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    return ["  " + "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            for row in table]


def as_markdown(rows: list[ModuleRow]) -> str:
    """The same table in Markdown, for TensorBoard's Text tab."""
    lines = ["| module | type | trainable | frozen |", "| --- | --- | ---: | ---: |"]
    lines += [f"| {r.name} | {r.kind} | {r.trainable:,} | {r.frozen:,} |" for r in [*rows, _total(rows)]]
    return "\n".join(lines)
