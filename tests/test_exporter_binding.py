"""exporter/serving/binding.py's can_listen, which the launcher asks before it starts a cluster: a port is
taken only when an exporter could not listen on it. A listener holds it; connections its server
closed (TIME-WAIT, 60 s after the last run's exporter went away) do not."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from exporter.serving.binding import REUSE_ADDRESS, can_listen
from scripts.ports import free_port
from tests.conftest import wait_until
from tests.launcher_support import time_wait_ports


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket bound as the exporter's sites bind (SO_REUSEADDR, which its connections inherit)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, REUSE_ADDRESS)
        sock.bind(("127.0.0.1", free_port()))
        sock.listen()
        yield sock


def test_a_port_someone_listens_on_is_taken_on_its_address_and_on_any(listener: socket.socket):
    port = listener.getsockname()[1]
    assert not can_listen("127.0.0.1", port)
    assert not can_listen("0.0.0.0", port)


def test_a_port_with_only_connections_in_time_wait_is_free(listener: socket.socket):
    port = listener.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port)) as client:
        served, _ = listener.accept()
        served.close()  # the server closes first, as an exporter does when it stops
        assert client.recv(1) == b""
    listener.close()
    wait_until(lambda: port in time_wait_ports(), 10, "the server's end in TIME-WAIT")
    with socket.socket() as plain, pytest.raises(OSError, match="in use"):
        plain.bind(("", port))  # the check the launcher used to make: refused by the TIME-WAIT socket
    assert can_listen("0.0.0.0", port)
    assert can_listen("127.0.0.1", port)



def test_the_check_runs_beside_a_running_event_loop(listener: socket.socket):
    """launcher.submit() called where an event loop runs (a notebook) asks it too."""
    port = listener.getsockname()[1]

    async def ask() -> tuple[bool, bool]:
        return can_listen("127.0.0.1", port), can_listen("127.0.0.1", free_port())

    assert asyncio.run(ask()) == (False, True)
