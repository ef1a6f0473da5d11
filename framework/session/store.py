"""The key-value store of a job's rendezvous (torch.distributed's TCPStore at MASTER_ADDR:MASTER_PORT), one per
process and restart attempt: the process group is built on it, and under an outer launcher rank 0 hands its
payload (the typed config and the run folder) to the other ranks through it before any group exists
(framework/session/channel.py)."""
from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING

from framework.session.environment import restart_attempt

if TYPE_CHECKING:
    import torch.distributed as dist

STORE_TIMEOUT = datetime.timedelta(minutes=10)
_stores: dict[int, "dist.Store"] = {}


def launch_store(rank: int, world_size: int) -> dist.Store:
    """The launcher's store, with keys private to this restart attempt.

    After the elastic agent restarts a worker group it hands the new workers the same store, which still holds the
    first attempt's keys; gloo then reads a dead peer's address and fails with 'connectFullMesh ... Connection
    refused'. A per-attempt prefix gives each attempt a clean slate. Rank 0 hosts the store unless the agent does
    (torchrun); created once per process, so the payload exchange and the process group share it."""
    import torch.distributed as dist  # here: the driver's front door (framework/cli.py) imports this module before torch

    attempt = restart_attempt()
    if attempt not in _stores:
        agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
            is_master=rank == 0 and not agent_hosts_store, timeout=STORE_TIMEOUT,
            multi_tenant=not agent_hosts_store,
        )
        _stores[attempt] = dist.PrefixStore(f"hydra_dist/attempt_{attempt}", store)
    return _stores[attempt]
