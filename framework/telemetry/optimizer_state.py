"""Bytes of optimizer state this process holds (memory/optimizer_state_mib/rank{r}): what a sharding engine saves
shows here. The state of the innermost torch optimizer (DeepSpeed's ZeRO wraps one whose parameters are this rank's
flat partitions), a DTensor counted by its local shard (fsdp)."""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def innermost_torch_optimizer(optimizer):
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def optimizer_state_bytes(optimizer) -> int:
    total = 0
    for state in innermost_torch_optimizer(optimizer).state.values():
        for t in state.values():
            if torch.is_tensor(t):
                local = t.to_local() if isinstance(t, DTensor) else t
                total += local.numel() * local.element_size()
    return total
