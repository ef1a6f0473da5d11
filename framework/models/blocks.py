"""A model's blocks: the modules that fsdp shards as one unit each and that trainer.activation_checkpointing
recomputes one at a time (trainer.compile compiles them one at a time under fsdp).

fully_shard needs a module with a forward (a ModuleList or ModuleDict is only a container: its children become the
blocks), so the choice descends through containers, and to the lists of repeated blocks a library's model keeps
inside its body (transformers' layer lists, timm's blocks); which blocks hold a tied parameter is fsdp's own concern
(framework/strategies/mesh/fsdp.py)."""
from __future__ import annotations

from torch import nn


def has_forward(module: nn.Module) -> bool:
    return type(module).forward is not nn.Module.forward


def holds_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def is_layer_list(module: nn.Module) -> bool:
    """A list of repeated blocks: an nn.ModuleList or nn.Sequential of two or more children of one class, each
    holding parameters (transformers' `layer` / `h` lists, timm's `blocks`, torchvision ResNet's stages)."""
    children = list(module.children())
    return (isinstance(module, (nn.ModuleList, nn.Sequential)) and len(children) >= 2
            and len({type(c) for c in children}) == 1 and all(holds_parameters(c) for c in children))


def auto_units(model: nn.Module) -> list[nn.Module]:
    """Each child of the root that holds parameters, descending through containers without a forward; the members
    of a list of repeated blocks are the units, and a child that holds such a list somewhere inside (a transformers
    model's body: BertModel > BertEncoder > layer) is descended into to find it."""
    units = []
    for child in model.children():
        if not holds_parameters(child):
            continue
        if is_layer_list(child):
            for block in child.children():
                units.extend([block] if has_forward(block) else auto_units(block))
        elif not has_forward(child) or any(is_layer_list(m) for m in child.modules()):
            units.extend(auto_units(child))
        else:
            units.append(child)
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
