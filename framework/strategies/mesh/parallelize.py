"""The sharded meshes' parallelize, in torchtitan's order (its parallelize_llama):

    PP       the pipeline stages this rank holds, the other stages' pieces dropped (pipeline_cut.py)
    TP       tensor parallel by the plan, on each of them (tensor_parallel.py)
    AC       activation checkpointing  } of the blocks the engine names (speedup_modules), put on by assembly before
    compile  torch.compile             } (framework/assemble.py); they wrap lazily, around the parallelized blocks
    DP       FSDP2/HSDP over the data-parallel axes (Sharded.wrap, sharded.py)

DDP itself on the 1-D replicate mesh (ddp.py) has none of them: which data parallel runs is chosen once, from the
degrees, when the engine is built (engine.py: data_parallel_for)."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from framework.config.strategy_options import MeshOptions
from framework.strategies.mesh.checkpoints import WholeModel
from framework.strategies.mesh.pipeline_cut import (changes_its_input, copy_input_first, cut, stage_pieces, stage_ranks,
                                                    view)
from framework.strategies.mesh.tensor_parallel import apply_tensor_parallel
from framework.strategies.mesh.tied import Tie, find_ties
from framework.training.engine import ProcessGroup


@dataclass(frozen=True)
class Stages:
    whole: WholeModel  # the whole model's state keys and parameter names, read before the cut
    parts: dict[int, nn.Module]  # this rank's stages by index (the model itself where it holds one)
    holders: list[int]  # the pipeline rank holding each stage
    ties: list[Tie]  # parameters two stages hold


def pipeline_stages(model: nn.Module, o: MeshOptions, group: ProcessGroup) -> Stages:
    """The model cut, in place, to the stages this rank holds; the whole model as one stage without pp."""
    whole = WholeModel(model)
    if o.pp == 1:
        return Stages(whole, {0: model}, [0], [])
    stages = stage_pieces(model, o.pp * o.virtual_stages, o.split_points)
    holders = stage_ranks(len(stages), o.pp, o.schedule)
    mine = [s for s in range(len(stages)) if holders[s] == group.coords["pp"]]
    ties = find_ties(model, {p: holders[s] for s, names in enumerate(stages) for p in names})
    cut(model, {p for s in mine for p in stages[s]})
    parts = {s: model if len(mine) == 1 else view(model, set(stages[s])) for s in mine}
    for s, part in parts.items():
        if s > 0 and changes_its_input(model, stages[s]):
            copy_input_first(part)
    return Stages(whole, parts, holders, ties)


def parallelize(model: nn.Module, options: MeshOptions, group: ProcessGroup) -> Stages:
    """PP, then TP on each of this rank's stages, in place."""
    stages = pipeline_stages(model, options, group)
    if options.tp > 1:
        for part in stages.parts.values():
            apply_tensor_parallel(part, options, group.axis("tp"))
    return stages
