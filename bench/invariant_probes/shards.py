"""Issue 58's probes, shared pieces: a global batch cut into K micro-shards (shard k = positions k mod K), a model
(LeNet or the char LM's GPT) and one shard's gradient computed on its own (grads set to None first)."""
from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F

from framework.models.gpt import GPT
from framework.models.lenet import LeNet

VOCAB, BLOCK = 96, 64


def model_and_batch(name: str, batch: int, dropout: float = 0.0, seed: int = 0):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    if name == "lenet":
        model = LeNet((1, 28, 28), 10)
        return model, (torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g))
    model = GPT((BLOCK,), VOCAB, n_layer=4, n_head=4, n_embd=128, dropout=dropout)
    tokens = torch.randint(0, VOCAB, (batch, BLOCK + 1), generator=g)
    return model, (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def shard(batch, k: int, shards: int):
    return tuple(t[k::shards].contiguous() for t in batch)


def shard_loss(model, part, global_batch: int) -> torch.Tensor:
    """This shard's share of the global batch's mean loss: its per-sample losses summed, over the global batch."""
    x, y = part
    out = model(x)
    if out.dim() == 2:
        return F.cross_entropy(out, y, reduction="sum") / global_batch
    per_token = F.cross_entropy(out.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    return per_token.mean(1).sum() / global_batch


def shard_gradient(model, part, global_batch: int) -> list[torch.Tensor]:
    for p in model.parameters():
        p.grad = None
    shard_loss(model, part, global_batch).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
