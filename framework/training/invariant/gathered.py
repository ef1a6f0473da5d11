"""The K shards' gradients gathered to every rank, then summed there in one fixed tree order (framework/training/
invariant/tree_sum.py): the same float additions in the same order on every world size."""
from __future__ import annotations

import torch

from framework.training.engine import ProcessGroup
from framework.training.invariant.shards import check_owned
from framework.training.invariant.tree_sum import tree_sum


class GatheredTreeSum:
    """Each rank sends its K/W shard gradients as one flat buffer; every rank receives all K and sums them."""

    def __init__(self, shards: int):
        self.shards = shards

    def reduce(self, owned: list[list[torch.Tensor]], group: ProcessGroup) -> list[torch.Tensor]:
        """owned[i]: shard (group.rank + i * W)'s gradient, a tensor per parameter. Returns the sum over all K
        shards, a tensor per parameter, bitwise the same for every W that divides K."""
        world = group.world_size
        check_owned(owned, world, self.shards)
        mine = torch.stack([torch.cat([t.reshape(-1) for t in grads]) for grads in owned])  # [K/W, P]
        every = group.all_gather(mine)  # [W, K/W, P]: shard k is every[k % W, k // W]
        total = tree_sum([every[k % world, k // world] for k in range(self.shards)])
        return [part.view_as(t) for part, t in zip(total.split([t.numel() for t in owned[0]]), owned[0])]
