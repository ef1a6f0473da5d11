"""A parameter two pipeline stages hold (an LM head tied to the token embedding: stage 0 and the last stage): each
holder keeps a copy, its gradient is the sum of the holders' gradients (as one process sums the two uses of one
tensor), and every copy steps alike. Holders on one rank (two stages of Interleaved1F1B) share the tensor itself, so
only holders on different ranks are summed here. The first holder's copy counts in the gradient norm; its name is
the one checkpoints use (the whole model's first name for it, as torch's optimizer state dicts do)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from framework.strategies.mesh.dims import NAMES, MeshDims


@dataclass(frozen=True)
class Tie:
    names: tuple[str, ...]  # every name of the parameter in the whole model, the canonical one first
    holders: tuple[int, ...]  # the pipeline ranks holding a copy


def find_ties(model: nn.Module, pp_rank_of_piece: dict[str, int]) -> list[Tie]:
    """Parameters registered under more than one name, and which pipeline ranks hold them (a name's piece decides)."""
    names_of: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    ties = []
    for names in names_of.values():
        if len(names) > 1:
            holders = sorted({rank for name in names for piece, rank in pp_rank_of_piece.items()
                              if name.startswith(piece + ".")})
            ties.append(Tie(tuple(names), tuple(holders)))
    return ties


def tied_on_one_rank(model: nn.Module, stages: list[list[str]], holders: list[int]) -> tuple[Tie, list[int]] | None:
    """A parameter two stages of one pipeline rank share (ZBVZeroBubble's V puts the first and the last stage, an LM's
    embedding and its tied head, on rank 0), and those stages; None when every shared parameter's stages are on
    different ranks. Each stage of a rank is an FSDP2 root of its own, and fully_shard replaces a parameter only on
    the modules of its own call: two roots make two parameters of one (checked in tests/dist/test_mesh_units.py)."""
    for tie in find_ties(model, {piece: s for s, names in enumerate(stages) for piece in names}):
        by_rank: dict[int, list[int]] = {}
        for stage in tie.holders:  # find_ties' holders are stage indices here
            by_rank.setdefault(holders[stage], []).append(stage)
        shared = next((same for same in by_rank.values() if len(same) > 1), None)
        if shared:
            return tie, shared
    return None


class TiedGradients:
    """Built on every rank, in the same order (it may create process groups, which every rank must create)."""

    def __init__(self, ties: list[Tie], model: nn.Module, dims: MeshDims, rank: int, pp_group):
        coords = dims.coordinates(rank)
        self.synced: list[tuple[nn.Parameter, object]] = []  # this rank's copies and the group summing them
        self.not_counted: set[int] = set()  # ids of copies another holder counts in the norm
        self.canonical: dict[str, str] = {}  # a name this rank holds the copy under -> the canonical name
        for tie in ties:
            if len(tie.holders) < 2:
                continue
            group = pp_group if len(tie.holders) == dims.pp else _holders_group(tie.holders, dims, coords)
            held = [name for name in tie.names if _holds(model, name)]
            if not held:
                continue
            param = model.get_parameter(held[0])
            self.synced.append((param, group))
            if coords["pp"] != tie.holders[0]:
                self.not_counted.add(id(param))
            for name in held:
                self.canonical[name] = tie.names[0]

    def sync(self) -> None:
        """Every holder: its copy's gradient becomes the sum over the holders (before clipping and the step)."""
        for param, group in self.synced:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            dist.all_reduce(grad, group=group)


def _holds(model: nn.Module, name: str) -> bool:
    try:
        model.get_parameter(name)
        return True
    except AttributeError:  # its module is another stage's (None here)
        return False


def _holders_group(holders: tuple[int, ...], dims: MeshDims, coords: dict[str, int]):
    """A group of the holders in this rank's slice of the mesh; every rank creates the groups of every slice."""
    mine = None
    others = [n for n in NAMES if n != "pp"]
    for place in (dict(zip(others, at)) for at in itertools.product(*(range(getattr(dims, n)) for n in others))):
        ranks = [_rank_at({**place, "pp": h}, dims) for h in holders]
        group = dist.new_group(ranks)
        if all(place[n] == coords[n] for n in others):
            mine = group
    return mine


def _rank_at(coords: dict[str, int], dims: MeshDims) -> int:
    rank = 0
    for name in NAMES:
        rank = rank * getattr(dims, name) + coords[name]
    return rank
