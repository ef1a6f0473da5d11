"""DeepSpeed's ZeRO stages 1 and 2, laid over a one-process trace: its engine flattens and partitions the model state
in buffers of its own, which fake tensors cannot build, so deepspeed is planned as one process on its share of the
batch (activations, temporaries, the batch, the whole parameters: every rank holds them under stages 1 and 2) with
what ZeRO holds instead of the rest, as deepspeed/runtime/zero/stage_1_and_2.py allocates it:

- an fp32 copy of this rank's partition of the parameters (the optimizer steps on it): parameters / N;
- the optimizer's state of that partition only: the traced state / N;
- this rank's partition of the averaged gradients (fp32), instead of the gradients: parameters / N;
- the gradient reduction buffer: reduce_bucket_size elements (5e8 by default: 1.86 GiB in fp32) when
  contiguous_gradients (the default), twice with overlap_comm (not the default below stage 3), whatever the model's
  size.

Stage 3 (parameters gathered in prefetch buckets), stage 0 and an optimizer offloaded to the CPU are not counted."""
from __future__ import annotations

import math
from dataclasses import dataclass

from framework.plan.tracer import BUFFERS, GRADIENTS, OPTIMIZER, PARAMETERS

PLANNED_STAGES = (1, 2)
DEFAULT_BUCKET = 500_000_000  # DeepSpeed's reduce_bucket_size default (elements)
FP32 = 4


def zero_refusal(options) -> str | None:
    """Why a deepspeed configuration cannot be planned yet, or None."""
    if options.zero_stage not in PLANNED_STAGES:
        why = ("ZeRO-3 gathers the parameters in prefetch buckets of its own" if options.zero_stage == 3 else
               "stage 0 reduces the whole gradients in buckets of its own")
        return (f"strategy.zero_stage={options.zero_stage} cannot be planned yet: {why}, not counted yet; plannable: "
                "strategy.zero_stage=1 or 2")
    if options.offload_optimizer:
        return ("strategy.offload_optimizer=true cannot be planned yet: the optimizer's state and step on the CPU "
                "are not counted; plannable: strategy.offload_optimizer=false")
    return None


@dataclass(frozen=True)
class ZeroStates:
    workers: int
    bucket_bytes: int  # the gradient reduction buffer(s)

    @classmethod
    def of(cls, engine_config: dict, workers: int) -> "ZeroStates":
        """From the DeepSpeed config the strategy generates (framework/strategies/deepspeed_config.py)."""
        zero = engine_config.get("zero_optimization", {})
        elements = int(zero.get("reduce_bucket_size", DEFAULT_BUCKET)) if zero.get("contiguous_gradients", True) else 0
        return cls(workers, elements * FP32 * (2 if zero.get("overlap_comm", False) else 1))

    def laid_over(self, at_peak: dict[str, int], peak: int) -> tuple[dict[str, int], int]:
        """The one-process trace's bytes at its peak, with ZeRO's model state instead of its own."""
        params = at_peak[PARAMETERS]
        partition = math.ceil(params / self.workers)
        zero = {**at_peak, PARAMETERS: params + partition, GRADIENTS: partition,
                OPTIMIZER: math.ceil(at_peak[OPTIMIZER] / self.workers), BUFFERS: at_peak[BUFFERS] + self.bucket_bytes}
        return zero, peak + sum(zero.values()) - sum(at_peak.values())
