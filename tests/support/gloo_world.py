"""A persistent gloo world for distributed unit tests: N ranks started once (per test module), one torch.distributed
process group among them, and each test's function run on every rank.

What torch's MultiProcContinuousTest does (internal API there, so a small one of our own): starting N processes and
a process group costs seconds; the collectives a unit test needs cost milliseconds. A test calls
`world.run(function, *args)`: `function` (a module-level function of the test module, so the ranks can import it)
runs on every rank as function(rank, world_size, *args), and the ranks' return values come back in rank order. An
exception on any rank fails the test with that rank's traceback. A failure or a hang must not hang or poison the
next test: the process group has a short timeout, a call has one deadline (`timeout` seconds for all its answers),
and after anything but a clean answer from every rank (a rank's failure, the deadline, or an exception in the
calling thread: a test's timeout signal, Ctrl-C) the world is ended (every rank killed) and the next call starts a
fresh one. Every answer carries the number of the call it answers, so an answer to an earlier call is never taken for
the current one's.

The group's store is a TCPStore this process hosts on a port the kernel gives it (port 0) and keeps until the world
ends: no port is picked, released and bound again later, which another program could take in between."""
from __future__ import annotations

import contextlib
import datetime
import itertools
import multiprocessing
import os
import queue
import time
import traceback
from typing import Any, Callable

COLLECTIVE_TIMEOUT_S = 30  # a rank left waiting in a collective by a failed peer errors out instead of hanging
START_TIMEOUT_S = 120
HOST = "127.0.0.1"


class GlooWorld:
    def __init__(self, size: int, env: dict[str, str] | None = None):
        """size ranks; env: variables the ranks get in place of this process's (the world outlives the test that
        starts it, so its ranks carry the module's id, not that test's)."""
        self.size = size
        self.env = dict(env or {})
        self._ranks: list[multiprocessing.Process] = []
        self._calls: list = []
        self._results = None
        self._store = None
        self._call_ids = itertools.count(1)  # 0: the ranks' start

    def run(self, function: Callable, *args: Any, timeout: float = 60) -> list:
        """function(rank, world_size, *args) on every rank; the return values in rank order. timeout: seconds for
        the whole call, every rank's answer included."""
        if not self._ranks or not all(process.is_alive() for process in self._ranks):
            self.close()
            self.start()
        call_id = next(self._call_ids)
        try:
            for calls in self._calls:
                calls.put((call_id, function, args))
            answers = self._answers(call_id, time.monotonic() + timeout)
        except BaseException:
            self.close()  # the ranks may still be in this call: the next one must not read its answers
            raise
        missing = sorted(set(range(self.size)) - set(answers))
        failures = [f"rank {rank}:\n{value}" for rank, (ok, value) in sorted(answers.items()) if not ok]
        if missing or failures:
            self.close()
        if missing:
            raise AssertionError(f"{function.__name__} did not return on rank(s) {missing} within {timeout} s "
                                 f"(the world is restarted for the next test)" + "".join(f"\n{f}" for f in failures))
        if failures:
            raise AssertionError(f"{function.__name__} failed:\n" + "\n".join(failures))
        return [answers[r][1] for r in range(self.size)]

    def _answers(self, call_id: int, deadline: float) -> dict[int, tuple[bool, Any]]:
        """Each rank's (ok, value) for call `call_id`, as many as arrive before the deadline."""
        answers = {}
        while len(answers) < self.size and (left := deadline - time.monotonic()) > 0:
            try:
                answered, rank, ok, value = self._results.get(timeout=left)
            except queue.Empty:
                break
            if answered != call_id:
                raise AssertionError(f"rank {rank} answered call {answered} while call {call_id} waited: the world "
                                     "was not ended after an earlier call")
            answers[rank] = (ok, value)
        return answers

    def start(self) -> None:
        """Starts the ranks and their process group (run() does it when none runs)."""
        import torch.distributed as dist

        context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of the test process's state
        self._store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=START_TIMEOUT_S))
        self._results = context.Queue()
        self._calls = [context.Queue() for _ in range(self.size)]
        self._ranks = [context.Process(target=_serve, args=(rank, self.size, self._store.port, self._calls[rank],
                                                            self._results),
                                       daemon=True, name=f"gloo-world-rank{rank}") for rank in range(self.size)]
        try:
            with _environment(self.env):
                for process in self._ranks:
                    process.start()
            answers = self._answers(0, time.monotonic() + START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        if len(answers) < self.size or not all(ok for ok, _ in answers.values()):
            self.close()
            if len(answers) < self.size:
                raise AssertionError(f"the gloo world of {self.size} ranks did not start within {START_TIMEOUT_S} s")
            raise AssertionError("the gloo world failed to start:\n" + "\n".join(
                f"rank {rank}:\n{value}" for rank, (ok, value) in sorted(answers.items()) if not ok))

    def close(self) -> None:
        for process in self._ranks:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)
        for q in [*self._calls, *([self._results] if self._results is not None else [])]:
            q.close()
            q.cancel_join_thread()
        self._ranks, self._calls, self._results, self._store = [], [], None, None

    def __enter__(self) -> "GlooWorld":
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            for calls in self._calls:
                calls.put(None)
        self.close()


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    """This process's environment with `env` in it while the ranks start (spawn copies it), as it was afterwards."""
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _serve(rank: int, size: int, port: int, calls, results) -> None:
    """One rank: join the group on the test process's store, then run each call until told to stop (None)."""
    import torch
    import torch.distributed as dist

    try:
        # the store's address, for code that reads it from the environment as under a launcher
        os.environ.update(MASTER_ADDR=HOST, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
        torch.set_num_threads(1)
        timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        store = dist.TCPStore(HOST, port, is_master=False, timeout=datetime.timedelta(seconds=START_TIMEOUT_S))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=timeout)
        results.put((0, rank, True, None))
    except BaseException:
        results.put((0, rank, False, traceback.format_exc()))
        return
    while (call := calls.get()) is not None:
        call_id, function, args = call
        try:
            results.put((call_id, rank, True, function(rank, size, *args)))
        except BaseException:
            results.put((call_id, rank, False, traceback.format_exc()))
    dist.destroy_process_group()
