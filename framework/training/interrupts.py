"""Ctrl-C and SIGTERM (the preemption signal of schedulers).

In-process strategies (single, dp): the first signal asks the loop to stop at the next step boundary,
after writing a checkpoint; a second signal stops at once. Elastic workers (ddp) are stopped by the
agent, and the last complete checkpoint is what survives. Either way a checkpoint written behind the loop
(trainer.async_checkpoint) is waited for before the run ends (Trainer.fit: Checkpointer.abandon)."""
from __future__ import annotations

import signal


class Interrupted(BaseException):
    """Raised when a signal ends the run (BaseException, so generic `except Exception` does not swallow it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class GracefulStop:
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise Interrupted(signum)
        self.signum = signum
        print(f"\n{signal.Signals(signum).name}: stopping after the current step (send it again to stop now)", flush=True)

    def __enter__(self) -> "GracefulStop":
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


class NoStop:
    """For workers whose stopping is the launcher's business."""

    requested = False
    signum = None
