"""The world-size-invariant mode's pieces (trainer.invariant; the loop runs InvariantStep: step.py).

A global batch is K fixed micro-shards: shard k holds the batch positions congruent to k mod K, so rank r of W owns
the shards k = r mod W (`owned_shards`). Each rank computes one gradient per owned shard, with the same shapes
whatever W is, and a reducer combines the K shards' gradients into a sum that does not depend on W:

- `GatheredTreeSum`: every shard's gradient gathered to every rank (a gather does no arithmetic) and summed in one
  fixed pairwise tree over k = 0..K-1 (`tree_sum`): plain float addition, K/W gradients sent per rank;
- `FixedPointSum`: per tensor, the largest |g| of any shard (gathered, exact) sets a power-of-two scale, each shard
  is rounded to an integer at that scale, the integers are summed exactly (int64, any order), and the sum is rounded
  once back to float: one int64 all-reduce (twice fp32's bytes). Not equal to plain float summation: equal across
  world sizes, and at least as close to the exact sum.

A rank's micro-batch is cut into its shards by `rank_shards` (no change to how the sampler deals), and each shard's
forward and backward draw their dropout masks from generators keyed by (seed, step, shard): `shard_draws`."""
from framework.training.invariant.draws import shard_draws, shard_key
from framework.training.invariant.fixed_point import FixedPointSum
from framework.training.invariant.gathered import GatheredTreeSum
from framework.training.invariant.shards import owned_shards, rank_shards
from framework.training.invariant.step import InvariantStep
from framework.training.invariant.tree_sum import tree_sum

__all__ = ["FixedPointSum", "GatheredTreeSum", "InvariantStep", "owned_shards", "rank_shards", "shard_draws", "shard_key", "tree_sum"]
