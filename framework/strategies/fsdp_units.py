"""Which modules fully_shard makes units of (each unit's parameters are all-gathered and freed together).

Two rules of FSDP2 shape the choice: fully_shard needs a module with a forward (a ModuleList or ModuleDict is only a
container: its children become the units), and a parameter shared by two modules (an LM head tied to the token
embedding) must live in one unit, so modules holding a tied parameter are left to the enclosing unit (the root)."""
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


def innermost_first(model: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    """fully_shard wants inner units before the ones around them (modules() lists parents first)."""
    order = {id(m): i for i, m in enumerate(model.modules())}
    return sorted(units, key=lambda u: -order[id(u)])
