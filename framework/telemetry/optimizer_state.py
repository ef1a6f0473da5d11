"""Bytes of optimizer state this process holds (memory/optimizer_state_mib/rank{r}): what a sharding engine saves
shows here. The state of the innermost torch optimizer (DeepSpeed's ZeRO wraps one whose parameters are this rank's
flat partitions), a DTensor counted by its local shard (fsdp)."""
from __future__ import annotations

import sys

import torch


def innermost_torch_optimizer(optimizer):
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def optimizer_state_bytes(optimizer) -> int:
    # A DTensor exists only once its module was imported (by fsdp): never import it here (a second per process)
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", ())
    total = 0
    for state in innermost_torch_optimizer(optimizer).state.values():
        for t in state.values():
            if torch.is_tensor(t):
                local = t.to_local() if isinstance(t, dtensor) else t
                total += local.numel() * local.element_size()
    return total
