"""Workers that an outer launcher already started: torchrun and the launchers like it (torch.distributed.launch,
DeepSpeed's `deepspeed`), SLURM or submitit tasks, horovodrun. Rank 0 runs Hydra, types and checks the config and
drives the run; the other ranks never run Hydra nor compose anything (so there is one run folder, and a user's
--config-dir needs no second reading): they wait for rank 0's payload (the typed settings and the run folder),
build the same strategy from it and join. A config error found by rank 0 reaches them the same way, so all end at
once and the message is said once.

How the payload travels before any process group exists: under torch's launchers through the rendezvous store
(MASTER_ADDR:MASTER_PORT, framework/launch/store.py), under horovodrun through Horovod's own broadcast."""
from __future__ import annotations

import pickle
import sys
import time

from omegaconf import DictConfig

from framework.errors import ConfigError
from framework.process.environment import HOROVOD, env_rank, outer_launcher
from framework.process.slurm import scheduler_name

_PAYLOAD_KEY, _RECEIVED_KEY = "payload", "payload_received"
_published: list[bool] = []  # rank 0 has told the others (payload or error)
ACK_TIMEOUT_S = 60  # how long rank 0 waits for the others to take an error before it exits


def launcher_name() -> str:
    """The outer launcher as a user would name it, for messages."""
    scheduler = scheduler_name()
    if scheduler:
        return {"slurm": "SLURM tasks", "local": "submitit_local tasks"}.get(scheduler, scheduler)
    return "horovodrun" if outer_launcher() == HOROVOD else "torchrun"


def multirun_refusal() -> str:
    return (f"-m/--multirun is not allowed under {launcher_name()}; run the sweep without it "
            "(for sweeps on SLURM: python train.py -m hydra/launcher=slurm ...)")


def choose_strategy(cfg: DictConfig, external: bool):
    """Resolve strategy=auto and find the strategy class; under an outer launcher only a strategy that can train with
    the workers that launcher started (Strategy.outer_launchers) is allowed. Returns (class, note)."""
    from framework.strategies import resolve_auto, strategies_for_launcher, strategy_class

    launcher = outer_launcher() if external else None
    note = resolve_auto(cfg, launcher)
    cls = strategy_class(cfg.strategy)
    if launcher is not None and launcher not in cls.outer_launchers:
        fits = ", ".join(strategies_for_launcher(launcher))
        raise ConfigError(
            f"strategy={cfg.strategy.name} is not allowed under {launcher_name()}: the launcher already started "
            f"several workers; use strategy={fits}{' or auto' if launcher != HOROVOD else ''}"
        )
    return cls, note


class _TorchChannel:
    """The rendezvous store of torch's launchers: rank 0 sets the payload, the others get it (waiting for it)."""

    def __init__(self):
        import os

        from framework.launch.store import launch_store

        self.world_size = int(os.environ["WORLD_SIZE"])
        self.store = launch_store(env_rank(), self.world_size)

    def publish(self, message: dict) -> None:
        self.store.set(_PAYLOAD_KEY, pickle.dumps(message))

    def receive(self) -> dict:
        message = pickle.loads(self.store.get(_PAYLOAD_KEY))
        self.store.add(_RECEIVED_KEY, 1)
        return message

    def wait_until_received(self) -> None:
        """Rank 0, after an error: every other rank took it (rank 0 may host the store, which dies with it)."""
        deadline = time.monotonic() + ACK_TIMEOUT_S
        while self.store.add(_RECEIVED_KEY, 0) < self.world_size - 1 and time.monotonic() < deadline:
            time.sleep(0.1)


class _HorovodChannel:
    def __init__(self):
        from framework.strategies.horovod import import_horovod

        self.hvd = import_horovod()
        self.hvd.init()

    def publish(self, message: dict) -> None:
        self._broadcast(message)

    def receive(self) -> dict:
        return self._broadcast(None)

    def _broadcast(self, message):
        from framework.strategies.horovod import broadcast_from_rank0

        return broadcast_from_rank0(self.hvd, message)

    def wait_until_received(self) -> None:
        pass  # the broadcast returned on rank 0 once every rank took part


def _channel():
    return _HorovodChannel() if outer_launcher() == HOROVOD else _TorchChannel()


def publish_to_followers(payload=None, error: str | None = None) -> None:
    """Rank 0: the payload for the other ranks, or the config error that ends them."""
    try:
        channel = _channel()
        _published.append(True)
        channel.publish({"error": error} if error is not None else {"payload": payload})
        if error is not None:
            channel.wait_until_received()
    except Exception as exc:  # the others then time out on their own; the error was said already
        if error is None:
            raise
        print(f"warning: the other ranks could not be told ({exc})", file=sys.stderr, flush=True)


def published() -> bool:
    return bool(_published)


def follow_rank0() -> int:
    """Ranks > 0 started by a launcher (framework/cli.py): no Hydra run, so no extra folder."""
    return 0 if follow() is None else 2


def follow() -> str | None:
    """Take rank 0's payload, build the strategy it names and train as one rank. Returns the error when rank 0
    found one (said by rank 0, and again here only where each task has a log of its own: SLURM/submitit)."""
    from framework.strategies import build_strategy
    from framework.training.interrupts import NoStop
    from framework.worker import worker_entry

    message = _channel().receive()
    if "error" in message:
        if scheduler_name():
            print(f"error: {message['error']}", file=sys.stderr, flush=True)
        return message["error"]
    payload = message["payload"]
    worker_entry(payload, build_strategy(payload.settings.strategy, payload.settings.trainer), stop=NoStop())
    return None
