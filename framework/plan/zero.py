"""DeepSpeed's ZeRO stages 1, 2 and 3, laid over a one-process trace: its engine flattens and partitions the model state
in buffers of its own, which fake tensors cannot build, so deepspeed is planned as one process on its share of the
batch (activations, temporaries, the batch, the whole parameters: every rank holds them under stages 1 and 2) with
what ZeRO holds instead of the rest, as deepspeed/runtime/zero/stage_1_and_2.py allocates it:

- an fp32 copy of this rank's partition of the parameters (the optimizer steps on it): parameters / N;
- the optimizer's state of that partition only: the traced state / N;
- this rank's partition of the averaged gradients (fp32), instead of the gradients: parameters / N;
- the gradient reduction buffer: reduce_bucket_size elements (5e8 by default: 1.86 GiB in fp32) when
  contiguous_gradients (the default), twice with overlap_comm (not the default below stage 3), whatever the model's
  size.

Stage 3 (deepspeed/runtime/zero/stage3.py, partition_parameters.py, parameter_offload.py) partitions the parameters
too: each tensor's partition (its 1/N, rounded up) is kept by every rank, with its fp32 copy for the optimizer, the
partition of the gradients and the optimizer's state of it (the traced state / N), and one gradient reduction buffer
of reduce_bucket_size elements (stage 3 keeps one, overlap_comm or not). A tensor of at most
stage3_param_persistence_threshold elements (1e5 by default) stays whole on every rank (persistent, up to
stage3_model_persistence_threshold elements in all); the others are gathered whole for their module's forward and
backward, and with DeepSpeed's default stage3_max_reuse_distance (1e9) a gathered tensor used again in backward is
not freed in between: at the peak (backward's start) the non-persistent tensors are counted as gathered, at most
stage3_max_live_parameters elements (1e9 by default). That bound is an estimate (DeepSpeed's prefetch order decides
which are live); the rest is DeepSpeed's arithmetic.

Stage 0 and an optimizer offloaded to the CPU are not counted."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from framework.plan.tracer import BUFFERS, GRADIENTS, OPTIMIZER, PARAMETERS

PLANNED_STAGES = (1, 2, 3)
DEFAULT_BUCKET = 500_000_000  # DeepSpeed's reduce_bucket_size default (elements)
PERSISTENCE = 100_000  # stage3_param_persistence_threshold's default (elements)
MAX_LIVE = 1_000_000_000  # stage3_max_live_parameters' default (elements)
FP32 = 4


def zero_refusal(options) -> str | None:
    """Why a deepspeed configuration cannot be planned yet, or None."""
    if options.zero_stage not in PLANNED_STAGES:
        return (f"strategy.zero_stage={options.zero_stage} cannot be planned yet: stage 0 reduces the whole "
                "gradients in buckets of its own, not counted yet; plannable: strategy.zero_stage=1, 2 or 3")
    if options.offload_optimizer:
        return ("strategy.offload_optimizer=true cannot be planned yet: the optimizer's state and step on the CPU "
                "are not counted; plannable: strategy.offload_optimizer=false")
    return None


@dataclass(frozen=True)
class ZeroStates:
    workers: int
    bucket_bytes: int  # the gradient reduction buffer(s)
    stage: int = 2
    partition: int = 0  # stage 3: this rank's elements, each tensor's 1/N rounded up
    whole: int = 0  # stage 3: elements every rank holds whole at the peak (persistent, and gathered)

    @classmethod
    def of(cls, engine_config: dict, workers: int, numels: list[int]) -> "ZeroStates":
        """From the DeepSpeed config the strategy generates (framework/strategies/deepspeed_config.py) and the
        model's parameter tensors' sizes (each tensor once)."""
        zero = engine_config.get("zero_optimization", {})
        stage = int(zero.get("stage", 2))
        elements = int(zero.get("reduce_bucket_size", DEFAULT_BUCKET)) if zero.get("contiguous_gradients", True) else 0
        if stage < 3:
            return cls(workers, elements * FP32 * (2 if zero.get("overlap_comm", False) else 1))
        persistent = _persistent(numels, int(zero.get("stage3_param_persistence_threshold", PERSISTENCE)),
                                 int(zero.get("stage3_model_persistence_threshold", sys.maxsize)))
        gathered = min(sum(numels) - persistent, int(zero.get("stage3_max_live_parameters", MAX_LIVE)))
        return cls(workers, elements * FP32, stage, sum(math.ceil(n / workers) for n in numels),
                   persistent + gathered)

    def laid_over(self, at_peak: dict[str, int], peak: int) -> tuple[dict[str, int], int]:
        """The one-process trace's bytes at its peak, with ZeRO's model state instead of its own."""
        params = at_peak[PARAMETERS]
        partition = self.partition * FP32 if self.stage == 3 else math.ceil(params / self.workers)
        kept = (self.whole * FP32 + partition) if self.stage == 3 else params  # stage 3: and the partition itself
        zero = {**at_peak, PARAMETERS: kept + partition, GRADIENTS: partition,
                OPTIMIZER: math.ceil(at_peak[OPTIMIZER] / self.workers), BUFFERS: at_peak[BUFFERS] + self.bucket_bytes}
        return zero, peak + sum(zero.values()) - sum(at_peak.values())


def _persistent(numels: list[int], threshold: int, model_threshold: int) -> int:
    """Elements of the tensors ZeRO-3 keeps whole (parameter_offload.py: mark_persistent_parameters)."""
    total = 0
    for n in numels:
        if n + total <= model_threshold and n <= threshold:
            total += n
    return total
