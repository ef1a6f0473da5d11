"""The gloo world itself (support/gloo_world.py), on this module's world of 2 ranks: a call interrupted in the test's
thread (what pytest-timeout's signal method and Ctrl-C do) leaves nothing for the next call, a call has one deadline
for all its answers, the group's store port is this process's from the start, and the ranks carry the module's id."""
import os
import signal
import time
from pathlib import Path

import pytest

from support.processes import TEST_ID


class _Interrupted(Exception):
    pass


def _interrupt_the_test_then_answer(rank: int, world_size: int, seconds: float) -> str:
    """Rank 0 signals the test process while every rank is in this call, which answers only later."""
    if rank == 0:
        os.kill(os.getppid(), signal.SIGUSR1)
    time.sleep(seconds)
    return "the interrupted call's answer"


def _echo(rank: int, world_size: int, value):
    return value


def _answer_after(rank: int, world_size: int, seconds_by_rank: list[float]) -> int:
    time.sleep(seconds_by_rank[rank])
    return rank


def _rendezvous_port(rank: int, world_size: int) -> int:
    return int(os.environ["MASTER_PORT"])


def _fail(rank: int, world_size: int):
    raise ValueError("on purpose")


def _test_id(rank: int, world_size: int) -> str | None:
    return os.environ.get(TEST_ID)


def test_a_call_interrupted_in_the_test_s_thread_leaves_no_answer_for_the_next_calls(world2):
    def interrupt(signum, frame):
        raise _Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with pytest.raises(_Interrupted):
            world2.run(_interrupt_the_test_then_answer, 5.0)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert [world2.run(_echo, call) for call in range(3)] == [[0, 0], [1, 1], [2, 2]]


def test_a_call_has_one_deadline_for_all_its_answers(world2):
    """Rank 0 answers after 2 s and rank 1 after 4 s: each within 3 s of the answer before, not of the call."""
    with pytest.raises(AssertionError, match=r"did not return on rank\(s\) \[(0, )?1\] within 3 s"):
        world2.run(_answer_after, [2.0, 4.0], timeout=3)


def test_the_ranks_rendezvous_on_a_port_this_process_holds(world2):
    """The group's store listens in this process, on a port the kernel gave it, from before the ranks start until
    the world ends: no port is picked, released, and bound again by a rank later, when another program may hold it."""
    [port, same] = world2.run(_rendezvous_port)
    assert port == same and port in _ports_this_process_listens_on()


def test_the_ranks_carry_the_module_s_id_also_after_a_restart(world2, _end_what_the_module_started):
    """The world outlives the test that starts it (and a test may restart it): its ranks are ended with the module."""
    assert world2.run(_test_id) == [_end_what_the_module_started] * 2
    with pytest.raises(AssertionError, match="on purpose"):
        world2.run(_fail)
    assert world2.run(_test_id) == [_end_what_the_module_started] * 2 != [os.environ[TEST_ID]] * 2


def _ports_this_process_listens_on() -> set[int]:
    sockets = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in sockets:  # 0A: LISTEN
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports
