"""How the exporter's TCP listeners bind, spelled once: for its sites (exporter/guard.py) and for
whoever asks beforehand whether one could listen on a port (the launcher, before it starts a cluster).

SO_REUSEADDR, as asyncio and aiohttp do by default on POSIX: a restarted exporter binds its port at
once although its last run's connections are still in TIME-WAIT there (60 s after it closed them).
A listener on the port still refuses the bind, with or without it.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

REUSE_ADDRESS = True


def can_listen(host: str, port: int) -> bool:
    """Whether an exporter site could listen on host:port now: the same bind as the site's (asyncio's
    create_server with REUSE_ADDRESS), in an event loop of its own, closed before it serves anything.
    A host of "0.0.0.0" asks for every IPv4 address: a listener on any one of them counts."""

    async def bind() -> None:
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, host, port,
                                                                reuse_address=REUSE_ADDRESS, start_serving=False)
        server.close()
        await server.wait_closed()

    # In a thread of its own: the caller may be running an event loop (the launcher's API in a notebook).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="can-listen") as thread:
        try:
            thread.submit(asyncio.run, bind()).result()
        except OSError:
            return False
    return True
