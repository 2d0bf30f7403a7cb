"""Free ports for the harness (tests, drills, demo, benchmarks): one place that knows how to find them."""

from __future__ import annotations

import random
import socket


def free_port() -> int:
    """A port no one listens on now (the kernel's choice, from the ephemeral range)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_free(port: int) -> bool:
    """Nothing is bound to `port` on any address."""
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
        return True


def free_port_range(ports: int) -> int:
    """A base whose next `ports` ports are free now, under Linux's ephemeral range (32768+), so that
    no client socket of this host is handed one of them while a server is expected there."""
    for _ in range(200):
        base = random.randrange(20000, 32000, 2)
        if all(port_free(port) for port in range(base, base + ports)):
            return base
    raise RuntimeError("no free port range")
