"""A model's blocks: the modules that fsdp shards as one unit each and that trainer.activation_checkpointing
recomputes one at a time (trainer.compile compiles them one at a time under fsdp).

fully_shard needs a module with a forward (a ModuleList or ModuleDict is only a container: its children become the
blocks), so the choice descends through containers; which blocks hold a tied parameter is fsdp's own concern
(framework/strategies/fsdp_units.py)."""
from __future__ import annotations

from torch import nn


def has_forward(module: nn.Module) -> bool:
    return type(module).forward is not nn.Module.forward


def auto_units(model: nn.Module) -> list[nn.Module]:
    """Each child of the root that holds parameters, descending through containers without a forward."""
    units = []
    for child in model.children():
        if next(child.parameters(), None) is None:
            continue
        units.extend(auto_units(child) if not has_forward(child) else [child])
    return units


def named_units(model: nn.Module, class_names: list[str]) -> list[nn.Module]:
    """Every submodule of one of these classes (containers without a forward: their children's units instead)."""
    found = []
    for module in model.modules():
        if module is not model and type(module).__name__ in class_names:
            found.extend([module] if has_forward(module) else auto_units(module))
    return found


def innermost_first(model: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    """Inner units before the ones around them (modules() lists parents first): the order fully_shard wants."""
    order = {id(m): i for i, m in enumerate(model.modules())}
    return sorted(units, key=lambda u: -order[id(u)])
