"""The harness's helpers in this process: the port a test names for a rendezvous. The run cache:
test_run_cache.py."""
import socket

from support.processes import ephemeral_ports, free_port


def test_a_port_named_for_a_rendezvous_is_free_and_below_the_ephemeral_range():
    """A port from bind(0) is an ephemeral one: any outgoing connection may be given it before the run binds it."""
    low, _ = ephemeral_ports()
    for port in {free_port() for _ in range(20)}:
        assert 1024 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
