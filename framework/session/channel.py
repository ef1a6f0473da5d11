"""How rank 0's word reaches the other ranks when another program started them all: torchrun and the launchers like
it (torch.distributed.launch, DeepSpeed's `deepspeed`), SLURM or submitit tasks, horovodrun. Rank 0 runs Hydra,
types and checks the config and drives the run; the other ranks never run Hydra nor compose anything (so there is
one run folder, and a user's --config-dir needs no second reading): they wait for rank 0's one message, which is
the payload (the typed settings and the run folder: they build the same strategy from it and join), the refusal
that ends them (so all end at once and the message is said once), or the folder of a sweep's job that finished
there before (nothing to do).

How the message travels before any process group exists: under torch's variables through the rendezvous store
(MASTER_ADDR:MASTER_PORT, store.py), under horovodrun through Horovod's own broadcast."""
from __future__ import annotations

import pickle
import sys
import time

from framework.session.environment import HOROVOD, Ranks
from framework.session.store import launch_store

_MESSAGE_KEY, _RECEIVED_KEY = "payload", "payload_received"
_told: list[bool] = []  # rank 0 has told the others (payload, refusal or finished)
ACK_TIMEOUT_S = 60  # how long rank 0 waits for the others to take its last word before it exits


class _TorchChannel:
    """The rendezvous store of torch's launchers: rank 0 sets the message, the others get it (waiting for it)."""

    def __init__(self, ranks: Ranks):
        self.world_size = ranks.world_size
        self.store = launch_store(ranks.rank, ranks.world_size)

    def send(self, message: dict) -> None:
        self.store.set(_MESSAGE_KEY, pickle.dumps(message))

    def receive(self) -> dict:
        message = pickle.loads(self.store.get(_MESSAGE_KEY))
        self.store.add(_RECEIVED_KEY, 1)
        return message

    def wait_until_received(self) -> None:
        """Rank 0, after its last word: every other rank took it (rank 0 may host the store, which dies with it)."""
        deadline = time.monotonic() + ACK_TIMEOUT_S
        while self.store.add(_RECEIVED_KEY, 0) < self.world_size - 1 and time.monotonic() < deadline:
            time.sleep(0.1)


class _HorovodChannel:
    def __init__(self, ranks: Ranks):
        import horovod.torch as hvd  # an optional engine: only under horovodrun, which comes with it

        self.hvd = hvd
        self.hvd.init()

    def send(self, message: dict) -> None:
        self._broadcast(message)

    def receive(self) -> dict:
        return self._broadcast(None)

    def _broadcast(self, message):
        # One explicit name: Horovod's default is the object's type name, and rank 0 sends a dict while the others
        # pass None, so the collectives would never match.
        return self.hvd.broadcast_object(message, root_rank=0, name="hydra_dist.rank0_message")

    def wait_until_received(self) -> None:
        pass  # the broadcast returned on rank 0 once every rank took part


def _channel(ranks: Ranks):
    return _HorovodChannel(ranks) if ranks.kind == HOROVOD else _TorchChannel(ranks)


def tell_followers(ranks: Ranks, payload=None, refusal: str | None = None, finished: str | None = None) -> None:
    """Rank 0: the payload for the other ranks, the refusal that ends them, or the run folder of a sweep's job that
    finished there before (nothing to do: they return). Said once: a second word finds nobody listening."""
    message = ({"refusal": refusal} if refusal is not None else {"finished": finished} if finished
               else {"payload": payload})
    try:
        channel = _channel(ranks)
        _told.append(True)
        channel.send(message)
        if "payload" not in message:  # rank 0 returns now, and may host the store that dies with it
            channel.wait_until_received()
    except Exception as exc:  # the others then time out on their own; the refusal was said already
        if "payload" in message:
            raise
        print(f"warning: the other ranks could not be told ({exc})", file=sys.stderr, flush=True)


def told_followers() -> bool:
    return bool(_told)


def hear_rank0(ranks: Ranks) -> dict:
    """Ranks > 0: rank 0's message, {"payload": ...}, {"refusal": ...} or {"finished": <run folder>} (waiting)."""
    return _channel(ranks).receive()
