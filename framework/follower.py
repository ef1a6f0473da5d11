"""Ranks > 0 of workers an outer launcher started (torchrun and the like, SLURM or submitit tasks, horovodrun): they
never run Hydra nor compose anything (so there is one run folder, and a user's --config-dir needs no second
reading). They wait for rank 0's payload (the typed settings and the run folder, framework/launch/outer.py), build
the same strategy from it and train as one rank. A config error found by rank 0 reaches them the same way, so all
end at once and the message is said once."""
from __future__ import annotations

import sys

from framework.config.targets import allowing
from framework.launch.outer import receive_from_rank0
from framework.process.slurm import scheduler_name
from framework.strategies import build_strategy
from framework.training.interrupts import NoStop
from framework.worker import worker_entry


def follow_rank0() -> int:
    """The command's exit code for a rank > 0 (framework/cli.py): 0, or 2 when rank 0 found a config error."""
    return 0 if follow() is None else 2


def follow() -> str | None:
    """Take rank 0's payload, build the strategy it names and train as one rank (nothing, when rank 0 found the job of
    a sweep finished before). Returns the error when rank 0 found one (said by rank 0, and again here only where each
    task has a log of its own: SLURM/submitit)."""
    message = receive_from_rank0()
    if "error" in message:
        if scheduler_name():
            print(f"error: {message['error']}", file=sys.stderr, flush=True)
        return message["error"]
    if "finished" in message:  # a sweep's job done before, in its folder: rank 0 reports it
        return None
    payload = message["payload"]
    with allowing(payload.settings.targets):  # the `_target_`s rank 0 allowed this run to build
        strategy = build_strategy(payload.settings.strategy, payload.settings.trainer)
    worker_entry(payload, strategy, stop=NoStop())
    return None
