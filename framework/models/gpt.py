"""A small causal transformer in the manner of nanoGPT (experiment=char_lm): token and position embeddings, n_layer
pre-norm blocks of causal self-attention (torch's scaled_dot_product_attention) and an MLP, a final LayerNorm and a
head tied to the token embedding. Input: token ids [B, T]; output: logits [B, T, vocabulary]. The dataset gives the
block size (in_shape = (T,)) and the vocabulary (num_classes). `generate` continues token ids (sample.py)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from framework.config.rules import at_least, between, require
from framework.common.errors import ConfigError


class CausalSelfAttention(nn.Module):
    """Queries, keys and values are separate projections, and the heads are counted from their width: under tensor
    parallel each rank's q, k and v hold whole heads of their own (n_head / tp), and proj joins them back."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.q = nn.Linear(n_embd, n_embd, bias=bias)
        self.k = nn.Linear(n_embd, n_embd, bias=bias)
        self.v = nn.Linear(n_embd, n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.head_size, self.dropout = n_embd // n_head, dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (z(x).view(b, t, -1, self.head_size).transpose(1, 2) for z in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(b, t, -1)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd, bias=bias), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd, bias=bias), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    # Tensor parallel (strategy=tp; framework/strategies/mesh/tensor_parallel.py has the styles): q, k, v and
    # the MLP's first layer split by output (each rank its own heads and hidden units), proj and the MLP's second
    # layer by input, so a block's two all-reduces are its only communication. Embeddings, norms and the tied head
    # stay whole on every rank (small for a character vocabulary).
    tensor_parallel_plan = {"blocks.*.attn.q": "colwise", "blocks.*.attn.k": "colwise", "blocks.*.attn.v": "colwise",
                            "blocks.*.attn.proj": "rowwise", "blocks.*.mlp.0": "colwise", "blocks.*.mlp.2": "rowwise"}
    # strategy.sequence_parallel=true: between the blocks' layers the residual stream is split along the sequence
    # (norms run on 1/tp of the positions; all-reduces become reduce-scatter + all-gather)
    sequence_parallel_plan = {
        "blocks.0": "shard_sequence", "blocks.*.ln_1": "sequence", "blocks.*.ln_2": "sequence",
        "blocks.*.attn": "gather_sequence", "blocks.*.mlp": "gather_sequence",
        "blocks.*.attn.q": "colwise", "blocks.*.attn.k": "colwise", "blocks.*.attn.v": "colwise",
        "blocks.*.attn.proj": "rowwise_to_sequence", "blocks.*.mlp.0": "colwise",
        "blocks.*.mlp.2": "rowwise_to_sequence",
        "ln_f": "sequence", "head": "gather_sequence"}

    def __init__(self, in_shape, num_classes: int, *, n_layer: int = 4, n_head: int = 4, n_embd: int = 128,
                 dropout: float = 0.0, bias: bool = False):
        super().__init__()
        require("model.n_layer", n_layer, at_least(1))
        require("model.n_head", n_head, at_least(1))
        require("model.n_embd", n_embd, at_least(n_head))
        require("model.dropout", dropout, between(0.0, 1.0, high_open=True))
        if n_embd % n_head:
            raise ConfigError(f"model.n_embd={n_embd} is not allowed with model.n_head={n_head}: it must divide evenly")
        self.block_size = int(in_shape[0])
        self.wte = nn.Embedding(num_classes, n_embd)
        self.wpe = nn.Embedding(self.block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.head = nn.Linear(n_embd, num_classes, bias=False)
        self.head.weight = self.wte.weight  # weight tying
        self.n_head = n_head
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def tp_divisible(self, sequence_parallel: bool) -> dict[str, int]:
        """Counts tensor parallel splits, by the key that sets each: every rank takes whole heads (and, split along
        the sequence, whole positions)."""
        return {"model.n_head": self.n_head, **({"dataset.block_size": self.block_size} if sequence_parallel else {})}

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        # A pipeline stage holds some of the modules; those of other stages are None (docs/model-parallel.md): the
        # first stage takes token ids, the others the hidden states of the one before.
        x = idx
        if self.wte is not None:
            x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for block in self.blocks:
            if block is not None:
                x = block(x)
        if self.ln_f is not None:
            x = self.ln_f(x)
        return self.head(x) if self.head is not None else x

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """ids [B, T] continued by max_new_tokens tokens drawn one at a time from the softmax of the last position's
        logits / temperature (only the top_k likeliest when given); the context is the last block_size tokens."""
        for _ in range(max_new_tokens):
            logits = self(ids[:, -self.block_size:])[:, -1, :] / temperature
            if top_k is not None and top_k < logits.size(-1):
                kth = torch.topk(logits, top_k).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            next_id = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)
            ids = torch.cat((ids, next_id), dim=1)
        return ids
