"""The harness's helpers in this process: the port a test names for a rendezvous, and the id that module-scoped
fixtures' processes carry (tests/conftest.py). The gloo world: tests/dist/test_gloo_world.py; the run cache:
test_run_cache.py; the unit tier's guards: tests/runs/test_harness_guards.py."""
import os
import socket

import pytest

from support.processes import TEST_ID, ephemeral_ports, free_port


def test_a_port_named_for_a_rendezvous_is_free_and_below_the_ephemeral_range():
    """A port from bind(0) is an ephemeral one: any outgoing connection may be given it before the run binds it."""
    low, _ = ephemeral_ports()
    for port in {free_port() for _ in range(20)}:
        assert 1024 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


@pytest.fixture(scope="module")
def _id_while_a_module_fixture_starts():
    """What a process a module-scoped fixture starts here (a shared run's build) would inherit."""
    return os.environ.get(TEST_ID)


def test_processes_of_a_module_fixture_carry_an_id_of_their_own(_id_while_a_module_fixture_starts):
    """The module's id, not the first test's: the fixture's processes may serve every test of the module, and what
    still runs when the module ends is killed then (tests/runs/test_harness_guards.py)."""
    assert _id_while_a_module_fixture_starts is not None
    assert os.environ[TEST_ID] != _id_while_a_module_fixture_starts  # the test's own, while it runs
