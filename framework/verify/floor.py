"""The rounding floor (docs/verify.md): a third run that computes what the one-process run computes, with only the
order of its float sums changed. How far it drifts from the one-process run, step by step, is how far rounding alone
carries this configuration: the verdict (framework/verify/verdict.py) excuses a gap within ten times that, and stops
telling equal from not once it passes the tolerance.

Which run stands for the rounding of a split batch:

- the ranks' micro-batches (trainer.deal_as_ranks=W, trainer.grad_accum=W x k): one process trains each step's global
  batch as the W data-parallel ranks' micro-batches, one after the other (framework/data/ranks_in_turn.py): each
  rank's samples, shapes, layout and threads, so each micro-batch runs the rank's kernels; only the order in which
  the gradients are summed differs. This is what a correct strategy's run differs from one process by.
- where the split cannot stand for it, the same run again with other kernels (framework/callbacks/other_kernels.py:
  another number of threads on the CPU, cuDNN's timed choice of algorithms on a GPU): a model that normalizes with
  the batch's statistics (BatchNorm in training mode: a micro-batch's statistics are not the batch's, so training the
  batch in micro-batches changes the arithmetic, not only its order), a run with no split over data-parallel processes
  (tensor or pipeline parallel alone split their sums inside a layer; dp splits the batch over the GPUs of one
  process), a dataset that shards itself (one process cannot read
  the ranks' shares). Where those kernels round alike, this floor reads 0 and the tolerances alone judge."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from framework.callbacks.switch_off import BATCHNORM_STATISTICS
from framework.data.streams import is_stream, shards_itself

OTHER_KERNELS = ["+callbacks.verify_other_order._target_=framework.callbacks.other_kernels.OtherKernels"]


@dataclass(frozen=True)
class FloorRun:
    name: str  # its folder, beside the one-process run it is compared with
    overrides: list[str]  # added to the one-process run's (replacing the user's values of the same keys)
    what: str  # the run in words, for the verdict


def floor_run(model: nn.Module, shares: int, grad_accum: int, both: list[str], train) -> FloorRun:
    """The floor for a comparison of `shares` data-parallel ranks accumulating `grad_accum` micro-batches each, with
    `both` (an experiment's overrides of both runs) applied."""
    why_not = _why_not_split(model, shares, both, train)
    if why_not is None:
        return FloorRun("single_as_ranks",
                        [f"trainer.deal_as_ranks={shares}", f"trainer.grad_accum={shares * grad_accum}"],
                        f"one process training each step as the {shares} ranks' micro-batches")
    return FloorRun("single_other_order", OTHER_KERNELS,
                    f"one process again with other kernels, since {why_not}")


def _why_not_split(model: nn.Module, shares: int, both: list[str], train) -> str | None:
    if shares < 2:
        return "the batch is not split over data-parallel processes"
    if normalizes_with_batch_statistics(model, both):
        return "BatchNorm's batch statistics would change in micro-batches"
    if is_stream(train) and shards_itself(train):
        return "the dataset shards itself over the ranks"
    return None


def normalizes_with_batch_statistics(model: nn.Module, both: list[str]) -> bool:
    """BatchNorm layers that normalize with the micro-batch's statistics in these runs: any, unless the experiment
    holds them to their running statistics (which a layer that tracks none does not have)."""
    held = any(o.endswith(f".what={BATCHNORM_STATISTICS}") for o in both)
    return any(not (held and m.track_running_stats) for m in model.modules() if isinstance(m, _BatchNorm))
