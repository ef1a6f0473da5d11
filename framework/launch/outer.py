"""How rank 0's payload reaches the other workers an outer launcher already started: torchrun and the launchers
like it (torch.distributed.launch, DeepSpeed's `deepspeed`), SLURM or submitit tasks, horovodrun. Rank 0 runs Hydra, types and checks the config and
drives the run; the other ranks never run Hydra nor compose anything (so there is one run folder, and a user's
--config-dir needs no second reading): they wait for rank 0's payload (the typed settings and the run folder),
build the same strategy from it and join. A config error found by rank 0 reaches them the same way, so all end at
once and the message is said once.

How the payload travels before any process group exists: under torch's launchers through the rendezvous store
(MASTER_ADDR:MASTER_PORT, framework/launch/store.py), under horovodrun through Horovod's own broadcast. The driver's
side of it (which strategy, following rank 0) is framework/follower.py."""
from __future__ import annotations

import os
import pickle
import sys
import time

from framework.launch.horovod_runner import broadcast_from_rank0, import_horovod
from framework.launch.store import launch_store
from framework.process.environment import HOROVOD, env_rank, outer_launcher

_PAYLOAD_KEY, _RECEIVED_KEY = "payload", "payload_received"
_published: list[bool] = []  # rank 0 has told the others (payload or error)
ACK_TIMEOUT_S = 60  # how long rank 0 waits for the others to take an error before it exits


class _TorchChannel:
    """The rendezvous store of torch's launchers: rank 0 sets the payload, the others get it (waiting for it)."""

    def __init__(self):
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
        self.hvd = import_horovod()
        self.hvd.init()

    def publish(self, message: dict) -> None:
        self._broadcast(message)

    def receive(self) -> dict:
        return self._broadcast(None)

    def _broadcast(self, message):
        return broadcast_from_rank0(self.hvd, message)

    def wait_until_received(self) -> None:
        pass  # the broadcast returned on rank 0 once every rank took part


def _channel():
    return _HorovodChannel() if outer_launcher() == HOROVOD else _TorchChannel()


def publish_to_followers(payload=None, error: str | None = None, finished: str | None = None) -> None:
    """Rank 0: the payload for the other ranks, the config error that ends them, or the run folder of a sweep's job
    that finished there before (nothing to do: they return)."""
    message = {"error": error} if error is not None else {"finished": finished} if finished else {"payload": payload}
    try:
        channel = _channel()
        _published.append(True)
        channel.publish(message)
        if "payload" not in message:  # rank 0 returns now, and may host the store that dies with it
            channel.wait_until_received()
    except Exception as exc:  # the others then time out on their own; the error was said already
        if "payload" in message:
            raise
        print(f"warning: the other ranks could not be told ({exc})", file=sys.stderr, flush=True)


def published() -> bool:
    return bool(_published)


def receive_from_rank0() -> dict:
    """Ranks > 0: rank 0's message, {"payload": ...}, {"error": ...} or {"finished": <run folder>} (waiting for it)."""
    return _channel().receive()
