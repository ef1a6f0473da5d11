"""FSDP2's own rules on the units fully_shard makes of a model's blocks (framework/models/blocks.py: the choice of
blocks, which activation checkpointing shares): a parameter shared by two modules (an LM head tied to the token
embedding) must live in one unit, so modules holding a tied parameter are left to the enclosing unit (the root); and a
module with running statistics (BatchNorm) is a unit of its own, kept in fp32 under a low-precision policy."""
from __future__ import annotations

import torch
from torch import nn


def with_running_statistics(model: nn.Module) -> list[nn.Module]:
    """BatchNorm (any dimension, SyncBatchNorm, InstanceNorm with track_running_stats): a low-precision parameter
    policy casts its weight but not its running statistics, and batch_norm refuses the mix ("expected scalar type
    BFloat16 but found Float", torchtitan#674)."""
    return [m for m in model.modules() if m is not model and isinstance(getattr(m, "running_mean", None), torch.Tensor)]


def tied_parameters(model: nn.Module, units: list[nn.Module]) -> dict[str, list[str]]:
    """Parameters registered under more than one unit (the root counts as one): name -> the names it has."""
    owner_of = {id(u): u for u in units}
    unit_names = {name: id(m) for name, m in model.named_modules() if id(m) in owner_of}
    placed: dict[int, dict[str, int]] = {}  # id(parameter) -> its names -> id of the innermost unit holding it
    for name, p in model.named_parameters(remove_duplicate=False):
        path = name.rsplit(".", 1)[0] if "." in name else ""
        unit = next((unit_names[prefix] for prefix in _prefixes(path) if prefix in unit_names), id(model))
        placed.setdefault(id(p), {})[name] = unit
    return {min(names): sorted(names) for names in placed.values() if len(set(names.values())) > 1}


def _prefixes(path: str) -> list[str]:
    """'a.b.c' -> ['a.b.c', 'a.b', 'a'] (innermost first)."""
    parts = path.split(".") if path else []
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def without_tied(model: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    """The units less the innermost one around each tied parameter's names, until no parameter is in two units (its
    parameters fall to the unit around it, at last the root)."""
    units = list(units)
    while True:
        tied = tied_parameters(model, units)
        if not tied:
            return units
        unit_names = {name: id(m) for name, m in model.named_modules() if any(m is u for u in units)}
        dropped = set()
        for name in (n for names in tied.values() for n in names):
            path = name.rsplit(".", 1)[0] if "." in name else ""
            innermost = next((unit_names[p] for p in _prefixes(path) if p in unit_names), None)
            if innermost is not None:
                dropped.add(innermost)
        units = [u for u in units if id(u) not in dropped]
