"""What every run verify.py starts takes from the strategy's run, beyond the user's overrides: the settings the
strategy's run resolves for itself, so that the one-process runs (the reference, the floor, every experiment's) use
the same memory layout and kernels as each of its ranks.

- trainer.channels_last: `auto` resolves per strategy and device (on for LeNet on the CPU; off on a GPU and under
  the engines that refuse it: fsdp, deepspeed, horovod, the mesh). Every run gets the strategy run's value: in
  another layout the convolutions run other kernels and round otherwise (a ReLU that flips at step 1 is a gap).
- CPU threads: each of the strategy's W local processes runs cpu_cores / W threads (OMP_NUM_THREADS, unless it is
  set already): every run gets as many, so that a kernel that splits its sums by thread splits them alike.

The other `auto` settings resolve alike for every strategy: trainer.accelerator (by the machine) and trainer.resume
(refused by verify.py). What the strategy's engine chooses for itself and no setting can hand over is in
docs/verify.md."""
from __future__ import annotations

import os
from dataclasses import dataclass

from framework.session.environment import threads_per_worker


@dataclass(frozen=True)
class Shared:
    overrides: list[str]
    environment: dict[str, str]


def shared_with_strategy(channels_last: bool, local_processes: int) -> Shared:
    """`channels_last`: the layout the strategy's run resolved; `local_processes`: its processes on this machine."""
    threads = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": str(threads_per_worker(local_processes))}
    return Shared([f"trainer.channels_last={str(channels_last).lower()}"], threads)
