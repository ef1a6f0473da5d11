"""A persistent gloo world for distributed unit tests: N ranks started once (per test module), one torch.distributed
process group among them, and each test's function run on every rank.

What torch's MultiProcContinuousTest does (internal API there, so a small one of our own): starting N processes and
a process group costs seconds; the collectives a unit test needs cost milliseconds. A test calls
`world.run(function, *args)`: `function` (a module-level function of the test module, so the ranks can import it)
runs on every rank as function(rank, world_size, *args), and the ranks' return values come back in rank order. An
exception on any rank fails the test with that rank's traceback. A failure or a hang must not hang or poison the
next test: the process group has a short timeout, a call waits at most `timeout` seconds, and after any failure the
world is ended (every rank killed) and the next test starts a fresh one."""
from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import queue
import socket
import traceback
from typing import Any, Callable

COLLECTIVE_TIMEOUT_S = 30  # a rank left waiting in a collective by a failed peer errors out instead of hanging
START_TIMEOUT_S = 120


class GlooWorld:
    def __init__(self, size: int, leave_out_env: tuple[str, ...] = ()):
        """size ranks; leave_out_env: variables of this process the ranks must not inherit (the world outlives the
        test that starts it, so it must not carry that test's id)."""
        self.size = size
        self.leave_out_env = leave_out_env
        self._ranks: list[multiprocessing.Process] = []
        self._calls: list = []
        self._results = None

    def run(self, function: Callable, *args: Any, timeout: float = 60) -> list:
        """function(rank, world_size, *args) on every rank; the return values in rank order."""
        if not self._ranks or not all(process.is_alive() for process in self._ranks):
            self.close()
            self.start()
        for calls in self._calls:
            calls.put((function, args))
        answers, failures = {}, []
        try:
            for _ in range(self.size):
                rank, ok, value = self._results.get(timeout=timeout)
                answers[rank] = value
                if not ok:
                    failures.append(f"rank {rank}:\n{value}")
        except queue.Empty:
            missing = sorted(set(range(self.size)) - set(answers))
            self.close()
            raise AssertionError(f"{function.__name__} did not return on rank(s) {missing} within {timeout} s "
                                 f"(the world is restarted for the next test)" +
                                 "".join(f"\n{f}" for f in failures)) from None
        if failures:
            self.close()
            raise AssertionError(f"{function.__name__} failed:\n" + "\n".join(failures))
        return [answers[r] for r in range(self.size)]

    def start(self) -> None:
        """Starts the ranks and their process group (run() does it when none runs)."""
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of the test process's state
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._results = context.Queue()
        self._calls = [context.Queue() for _ in range(self.size)]
        self._ranks = [context.Process(target=_serve, args=(rank, self.size, port, self._calls[rank], self._results),
                                       daemon=True, name=f"gloo-world-rank{rank}") for rank in range(self.size)]
        left_out = {name: os.environ.pop(name) for name in self.leave_out_env if name in os.environ}
        try:
            for process in self._ranks:
                process.start()
        finally:
            os.environ.update(left_out)
        for _ in range(self.size):
            try:
                rank, ok, value = self._results.get(timeout=START_TIMEOUT_S)
            except queue.Empty:
                self.close()
                raise AssertionError(f"the gloo world of {self.size} ranks did not start within {START_TIMEOUT_S} s")
            if not ok:
                self.close()
                raise AssertionError(f"rank {rank} of the gloo world failed to start:\n{value}")

    def close(self) -> None:
        for process in self._ranks:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)
        for q in [*self._calls, *([self._results] if self._results is not None else [])]:
            q.close()
            q.cancel_join_thread()
        self._ranks, self._calls, self._results = [], [], None

    def __enter__(self) -> "GlooWorld":
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            for calls in self._calls:
                calls.put(None)
        self.close()


def _serve(rank: int, size: int, port: int, calls, results) -> None:
    """One rank: join the group, then run each call until told to stop (None)."""
    import torch
    import torch.distributed as dist

    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        results.put((rank, True, None))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        return
    while (call := calls.get()) is not None:
        function, args = call
        try:
            results.put((rank, True, function(rank, size, *args)))
        except BaseException:
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()
