"""One training step of the world-size-invariant mode (trainer.invariant): what Trainer._train_step runs when
assembly hands it an InvariantStep. The rank's micro-batch is cut into its K/W micro-shards; each shard is augmented
with a generator keyed by (seed, epoch, step, shard) and runs forward and backward under the engine's no_sync (its own
reduction off) and shard_draws (dropout keyed by the shard); its gradients are stashed; after the last shard the
reducer's exact sum over all K shards is written into p.grad, in the parameter's memory layout as backward would
leave it (a channels_last weight's gradient channels_last: fused optimizers take both in memory order, CUDA's refuse
other strides and the CPU's read the wrong elements), and the loop clips and steps as always."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from framework.training.engine import ProcessGroup, Weighting, Wrapped, forward_backward, gradient_sync
from framework.training.invariant.draws import augment_key, shard_draws
from framework.training.invariant.loss_meter import GlobalLossMeter
from framework.training.invariant.shards import rank_shards
from framework.training.invariant.tree_sum import tree_sum


@dataclass
class StepLosses:
    """What the meters get: each shard's per-sample losses and tokens (this rank's own), and the step's loss summed
    over all K shards in one fixed order (the same bits on every world size)."""

    per_shard: list[torch.Tensor]
    tokens: list
    global_sum: torch.Tensor


class InvariantStep:
    meters = (GlobalLossMeter,)  # the mode's own telemetry (framework/telemetry/meter.py), added at assembly

    def __init__(self, shards: int, reducer, group: ProcessGroup, seed: int, prepare):
        """reducer: FixedPointSum or GatheredTreeSum; prepare(shard, generator) -> the shard as the model takes it
        (its own copy, augmented with the generator where the dataset augments)."""
        self.shards, self.reducer, self.group, self.seed, self.prepare = shards, reducer, group, seed, prepare

    def run(self, wrapped: Wrapped, data, micro_batch, step: int, epoch: int) -> StepLosses:
        """data: the loop's LoopData (its step and loss). Leaves the summed gradient in every parameter's .grad."""
        group = self.group
        params = [p for p in wrapped.model.parameters() if p.requires_grad]
        stash, losses, tokens = [], [], []
        for k, shard in rank_shards(micro_batch, group.dp_rank, group.dp_size, self.shards):
            generator = torch.Generator(device=group.device).manual_seed(augment_key(self.seed, epoch, step, k))
            shard = self.prepare(shard, generator)
            with gradient_sync(wrapped, on=False), shard_draws(self.seed, step, k, group.devices):
                out = forward_backward(wrapped, data.step, shard, data.loss, Weighting(self.shards))
            # a clone: DDP's gradient_as_bucket_view makes p.grad a view into its bucket
            stash.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params])
            for p in params:
                p.grad = None
            losses.append(out.loss.detach())
            tokens.append(out.tokens)
        for p, summed in zip(params, self.reducer.reduce(stash, group)):
            p.grad = summed if summed.stride() == p.stride() else torch.empty_like(p).copy_(summed)
        return StepLosses(losses, tokens, self._global_loss(losses))

    def _global_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """Each shard's loss sum (float64), gathered; the K of them tree-summed in shard order."""
        world = self.group.dp_size
        every = self.group.all_gather(torch.stack([loss.double().sum() for loss in losses]))  # [W, K/W]
        return tree_sum([every[k % world, k // world] for k in range(self.shards)])
