"""A user's language model that tensor and pipeline parallel can split (strategy=tp_plan, strategy=pp;
docs/model-parallel.md has the contract): an embedding, residual MLP blocks in a ModuleList, a norm and a head.

- tensor parallel: conf/strategy/tp_plan.yaml names each block's layers by pattern (blocks.*.up colwise,
  blocks.*.down rowwise): every rank holds half of each block's hidden units; or parallelize() below, the same split
  in torch's own API, named by conf/strategy/tp_function.yaml (strategy.parallelize: a function (model, mesh));
- pipeline parallel: the blocks are shared out over the stages (or cut at strategy.split_points); the forward skips
  a module that is None (the other stages' pieces), and passes one tensor from stage to stage."""
import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class Residual(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class ResidualLM(nn.Module):
    """Token ids [B, T] -> logits [B, T, V], each position on its own (no attention: small, and enough to split)."""

    def __init__(self, num_classes, hidden: int = 32, layers: int = 4):
        super().__init__()
        self.embed = nn.Embedding(num_classes, hidden)
        self.blocks = nn.ModuleList(Residual(hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, ids):
        x = self.embed(ids) if self.embed is not None else ids
        for block in self.blocks:
            if block is not None:
                x = block(x)
        if self.norm is not None:
            x = self.norm(x)
        return self.head(x) if self.head is not None else x


def parallelize(model: ResidualLM, mesh) -> None:
    """Tensor parallel over `mesh` (the tp axis), in place: each block's up layer split by outputs, its down layer by
    inputs (on a pipeline rank, only the blocks of its own stages are there)."""
    plan = {}
    for index, block in enumerate(model.blocks):
        if block is not None:
            plan[f"blocks.{index}.up"], plan[f"blocks.{index}.down"] = ColwiseParallel(), RowwiseParallel()
    parallelize_module(model, mesh, plan)
