"""Pipeline stages cut by module name, as torchtitan cuts them: a model is a sequence of pieces (the root's children
in the order they were registered, entries of a ModuleList or ModuleDict taken one by one, and so are the entries of
an nn.Sequential that is the model or one of its top-level parts), a split point names the piece a stage begins
with, and a stage is the model itself with every other stage's pieces dropped, so its parameters keep the whole
model's names (what makes a checkpoint resume on another mesh). A dropped piece is set to None, or, in an
nn.Sequential, removed from it: a Sequential runs the entries it has, so a stage of a Sequential is the Sequential of
its own pieces (under their own indices), and an emptied one passes its input on. The contract a model keeps
(docs/model-parallel.md): its forward runs its pieces in that order, skips a piece that is None, and passes one tensor
from one stage to the next. Checked in the driver by running each stage's forward on meta tensors."""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call

from framework.data.batches import leaves, tree_map
from framework.common.errors import ConfigError, first_line
from framework.models.blocks import has_forward
from framework.telemetry.flops import silenced

CONTRACT = ("a model pipeline parallel cuts runs its modules in the order they are registered, skips a module that is "
            "None (the pieces other stages hold), and passes one tensor from stage to stage; docs/model-parallel.md")


def runs_its_entries(module: nn.Module) -> bool:
    """An nn.Sequential whose forward is Sequential's own: it calls the entries it holds, in order."""
    return isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward


def pieces(model: nn.Module) -> list[str]:
    """The names of the model's pieces, in order: the root's children; entries of containers (ModuleList,
    ModuleDict: modules without a forward of their own) one by one; and the entries of the root's nn.Sequential
    children (the root's own, when the model is one) one by one (LeNet: features.0, ..., classifier.2)."""
    found = []

    def walk(module: nn.Module, prefix: str, top: bool) -> None:
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            if not has_forward(child) or (top and runs_its_entries(child)):
                walk(child, full + ".", top=False)
            else:
                found.append(full)

    walk(model, "", top=True)
    return found


def blocks(model: nn.Module) -> list[str]:
    """The model's blocks: the pieces of its largest container (torchtitan's layers; the GPT's blocks; a
    Sequential model's entries)."""
    by_parent: dict[str, list[str]] = {}
    for name in pieces(model):
        parent = name.rsplit(".", 1)[0] if "." in name else ("" if runs_its_entries(model) else None)
        if parent is not None:
            by_parent.setdefault(parent, []).append(name)
    return max(by_parent.values(), key=len, default=[])


def stage_pieces(model: nn.Module, stages: int, split_points: list[str] | None) -> list[list[str]]:
    """Each stage's pieces, in order. split_points: the pieces stages 1.. begin with; None: the blocks shared as
    evenly as they go (earlier stages take one more), what comes before them in the first stage, after them in the
    last. ConfigError for split points that are not pieces, out of order, or too few or many."""
    names = pieces(model)
    if split_points is None:
        split_points = _even_split(model, names, stages)
    elif len(split_points) != stages - 1:
        raise ConfigError(f"strategy.split_points={list(split_points)} is not allowed: {stages} stages need "
                          f"{stages - 1} split point(s) (where stages 2..{stages} begin)")
    starts = []
    for point in split_points:
        if point not in names:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise ConfigError(f"strategy.split_points: {point!r} is not allowed for {type(model).__name__}: a split "
                              f"point names a piece of the model where a stage begins ({shown})")
        starts.append(names.index(point))
    if starts != sorted(set(starts)) or (starts and starts[0] == 0):
        raise ConfigError(f"strategy.split_points={list(split_points)} is not allowed: they must follow the model's "
                          f"order ({', '.join(names)}), each after the one before, none at its first piece")
    bounds = [0, *starts, len(names)]
    return [names[a:b] for a, b in zip(bounds, bounds[1:])]


def _even_split(model: nn.Module, names: list[str], stages: int) -> list[str]:
    found = blocks(model)
    if len(found) < stages:
        raise ConfigError(f"strategy.pp x strategy.stages_per_rank = {stages} stages is not allowed for "
                          f"{type(model).__name__}: it has {len(found)} blocks to share out (a ModuleList or "
                          "ModuleDict's entries, or a top-level nn.Sequential's); use fewer stages, or "
                          "strategy.split_points")
    per, extra = divmod(len(found), stages)
    sizes = [per + (1 if i < extra else 0) for i in range(stages)]
    return [found[sum(sizes[:i])] for i in range(1, stages)]


def stage_ranks(stages: int, pp: int, schedule: str) -> list[int]:
    """The pipeline rank that holds each stage: a loop over the ranks (stage s on rank s % pp), or for ZBVZeroBubble
    a V, down the ranks and back up (pp=2: stages 0 and 3 on rank 0, 1 and 2 on rank 1), as torch's
    generate_stage_to_rank_mapping lays them out for each style."""
    if schedule != "ZBVZeroBubble":
        return [s % pp for s in range(stages)]
    return [s % pp if (s // pp) % 2 == 0 else pp - 1 - s % pp for s in range(stages)]


def cut(model: nn.Module, keep: set[str]) -> nn.Module:
    """In place: every piece not in keep dropped (the parameters of those kept keep their names)."""
    for name in pieces(model):
        if name not in keep:
            _drop(model, name)
    return model


def _drop(model: nn.Module, name: str) -> None:
    """A piece out of its parent: removed from an nn.Sequential (which then does not call it), else set to None."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if runs_its_entries(parent):
        delattr(parent, child)
    else:
        parent.register_module(child, None)


def view(model: nn.Module, keep: set[str]) -> nn.Module:
    """A new root (and containers) holding the same kept pieces, parameters and buffers as model, the others dropped:
    one stage of several this rank holds, sharing its modules with the rank's model."""
    memo = {}
    names = pieces(model)
    for name in names:
        piece = model.get_submodule(name)
        memo[id(piece)] = piece if name in keep else None
    for tensor in [*model.parameters(), *model.buffers()]:  # any outside the pieces (root-level) stays shared too
        memo.setdefault(id(tensor), tensor)
    stage = copy.deepcopy(model, memo)
    for name in names:
        if name not in keep:
            _drop(stage, name)
    return stage


def changes_its_input(model: nn.Module, names: list[str]) -> bool:
    """Whether a stage's first piece changes its input in place (torch's activations with inplace=True: LeNet's
    ReLU after a convolution): a stage after the first gets the tensor the pipeline received, which autograd keeps
    as it came (a leaf that requires grad), so such a stage copies its input first (copy_input_first)."""
    return bool(getattr(model.get_submodule(names[0]), "inplace", False))


def copy_input_first(stage: nn.Module) -> None:
    stage.register_forward_pre_hook(lambda module, args: tuple(a.clone() if torch.is_tensor(a) else a for a in args))


def check_stages(model: nn.Module, stages: list[list[str]], example, key: str) -> None:
    """Each stage's forward on meta tensors, the first given `example` (a batch of the real input), every later
    one the tensor the stage before returned, as a leaf that requires grad (what the pipeline hands it: a stage that
    changes it in place fails as in a worker); the last must return what the whole model does. ConfigError (one
    line, with the contract) where that fails."""
    x = meta_batch(example)
    with silenced():
        try:
            with torch.no_grad():
                expected = functional_call(model, on_meta(model), (x,))
        except Exception:  # the whole model cannot run on meta tensors: the real batch through the model decides
            return
        for index, names in enumerate(stages):
            stage = view(model, set(names))
            if index > 0:
                x = x.detach().requires_grad_()
                if changes_its_input(model, names):
                    copy_input_first(stage)
            try:
                x = functional_call(stage, on_meta(stage), (x,))
            except Exception as exc:
                raise ConfigError(_refusal(model, key, index, stages, f"{type(exc).__name__}: {first_line(exc)}")) from None
            if index < len(stages) - 1 and not (torch.is_tensor(x) and x.is_floating_point()):
                raise ConfigError(_refusal(model, key, index, stages, f"it returns {_describe(x)}, not one tensor of "
                                                                      "floats"))
    if _shapes(x) != _shapes(expected):
        raise ConfigError(_refusal(model, key, len(stages) - 1, stages, f"the last stage returns {_describe(x)}, the "
                                                                        f"whole model {_describe(expected)}"))


def meta_batch(example):
    """The batch as meta tensors of its shapes and dtypes (the driver's checks run the model on them)."""
    return tree_map(lambda t: torch.empty_like(t, device="meta"), example)


def on_meta(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters and buffers as meta tensors of their shapes (a tied one under one of its names)."""
    return {name: torch.empty_like(t, device="meta") for name, t in [*module.named_parameters(),
                                                                     *module.named_buffers()]}


def _refusal(model, key: str, index: int, stages: list[list[str]], what: str) -> str:
    held = ", ".join(stages[index])
    return (f"{key} is not allowed for {type(model).__name__}: its forward does not run as pipeline stages (stage "
            f"{index + 1} of {len(stages)}, holding {held}: {what}); {CONTRACT}")


def _shapes(x) -> list:
    return [(tuple(t.shape), t.dtype) for t in leaves(x)]


def _describe(x) -> str:
    shapes = [f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in leaves(x)]
    return ", ".join(shapes) or type(x).__name__
