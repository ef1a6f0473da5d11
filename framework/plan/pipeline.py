"""Pipeline parallel in the plan: each pipeline rank's row, its stages run by the run's own schedule in the fake
process group. torch's schedule would learn a stage's input and output shapes from messages between the ranks, which
a fake process group does not carry; the plan works them out first, on the whole model (each stage's forward on fake
tensors, one after another, on one pipeline micro-batch, under the run's autocast), and gives them to each
PipelineStage (static metadata: torch then exchanges nothing before the first step). The schedule's own actions then
run on this rank's stages, so the activations of the micro-batches it keeps in flight (GPipe: all of them; 1F1B: as
many as the stages after this one, plus one) are alive together at the peak, as in a real run."""
from __future__ import annotations

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functional_call

from framework.strategies.mesh.pipeline_cut import changes_its_input, copy_input_first, stage_pieces, view
from framework.strategies.mesh.pipeline_run import inputs_of, split
from framework.training.precision import Precision


PLANNED_SCHEDULES = ("GPipe", "1F1B")  # checked against real runs (docs/plan.md)


def pipeline_refusal(options) -> str | None:
    """Why a pipeline configuration cannot be planned yet, or None (no pipeline, or one the plan checks)."""
    if getattr(options, "pp", 1) == 1:
        return None
    if options.schedule not in PLANNED_SCHEDULES:
        return (f"strategy.schedule={options.schedule} cannot be planned yet: a schedule of several stages per rank "
                "(or a split backward) has not been checked against a real run; plannable: strategy.schedule="
                f"{' or '.join(PLANNED_SCHEDULES)}")
    others = [f"strategy.{axis}={getattr(options, axis)}" for axis in ("tp", "dp_shard", "dp_replicate")
              if getattr(options, axis, 1) not in (1, None)]
    if others:
        return (f"strategy.pp={options.pp} with {', '.join(others)} cannot be planned yet: a pipeline composed with "
                "other mesh axes has not been checked against a real run; plannable: a pipeline alone")
    return None


def pipeline_ranks(options, workers: int) -> list[int]:
    """The global rank of each pipeline rank whose other mesh coordinates are 0 (pp is the mesh's outer axis)."""
    return [r * (workers // options.pp) for r in range(options.pp)]


def stage_shapes(model: nn.Module, options, batch, precision: str) -> dict[int, tuple]:
    """Each stage's (input, output), as tensors on the meta device, for one pipeline micro-batch: the loop's
    micro-batch `batch` cut in strategy.microbatches."""
    stages = stage_pieces(model, options.pp * options.virtual_stages, options.split_points)
    views = [view(model, set(names)) for names in stages]
    for index, names in enumerate(stages):
        if index > 0 and changes_its_input(model, names):
            copy_input_first(views[index])
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    x = inputs_of(split(batch, options.pipeline_microbatches)[0])
    shapes = {}
    with mode, Precision(precision, torch.device("cpu")).autocast(), torch.no_grad():
        x = mode.from_tensor(x)
        for index, stage in enumerate(views):
            fakes = {n: mode.from_tensor(t) for n, t in [*stage.named_parameters(), *stage.named_buffers()]}
            y = functional_call(stage, fakes, (x,))
            shapes[index] = (_meta(x, index > 0), _meta(y, True))
            x = y
    return shapes


def _meta(t: torch.Tensor, grad: bool) -> torch.Tensor:
    """What the stage receives or sends: a stage's floating-point output, and a later stage's input, take a
    gradient back (the stage's forward ran without autograd here)."""
    return torch.empty(t.shape, dtype=t.dtype, device="meta", requires_grad=grad and t.is_floating_point())


def static_stages(runner, shapes: dict[int, tuple]) -> None:
    """The runner's stages and schedule made again with their shapes given. A rank without the last stage is told
    the step counts no tokens: it would learn that from the last one's message (the token count holds no memory)."""
    runner.staged(shapes)
    if not runner.holds_last:
        runner.counts_tokens = False
