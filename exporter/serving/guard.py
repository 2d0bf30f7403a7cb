"""Bounds on what clients of the exporter's ports can hold: connections, time, slow reads, scrapes.

aiohttp keeps an idle connection for an hour and waits for request headers forever; a hundred idle
sockets once took every file descriptor of an exporter, so /healthz timed out and collectors failed.
Every connection is therefore a `Guarded` protocol around aiohttp's own:

- at most `max_connections` at once: at the cap, the oldest connection that has sent nothing for a
  second since it connected is dropped to make room (holding sockets open costs an attacker nothing;
  a probe must get through), else the one whose request has been the longest in its headers (a second
  at least: a client that sends `GET /metrics HTTP/1.1` and then nothing held every slot, and a
  liveness probe failed), and if there is none the new one is answered 503 and closed at once;
- `idle_timeout_seconds` to send a whole header block, after connecting or from a request's first
  byte: a slow sender is closed, and so (by aiohttp's keep-alive bound) is a connection idle between
  requests;
- `write_timeout_seconds` for a client that stops reading a response: its connection is aborted;

and at most `max_requests` scrapes are served at once (node_exporter's --web.max-requests), more
get 503. The bounds are global, never a product of per-client limits.

No request body is ever decompressed: aiohttp inflated a `Content-Encoding: gzip` body as it arrived,
before any handler or auth ran (a 2 MB gzip body to /healthz cost 6.75 CPU-s), and a broken one wrote
a traceback. Both ports parse with auto_decompress off, and `identity_bodies_only` answers 415 to a
request that declares any other content coding, from its headers alone, first of all middlewares.
"""

from __future__ import annotations

import asyncio
import resource
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web

from exporter.config import HttpSettings
from exporter.framework import selfmetrics
from exporter.framework.snapshot import SampleSink
from exporter.serving import httplog
from exporter.serving.binding import REUSE_ADDRESS

BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
        b"Content-Length: 33\r\n\r\ntoo many connections; try again\r\n")
HEADERS_END = b"\r\n\r\n"
IDENTITY = "identity"  # the one content coding a request body may have (RFC 9110 8.4.1)
EVICTABLE_AFTER_S = 1.0  # a younger silent connection may just not have been read yet: never dropped


def connection_cap(settings: HttpSettings) -> int:
    """The configured cap, never more than a quarter of the file descriptors this process may open:
    the collectors and the progress endpoint keep the rest."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(4, min(settings.max_connections, soft // 4 if soft > 0 else settings.max_connections))


class Guard:
    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self.max_connections = connection_cap(settings)
        self.open: dict[Guarded, None] = {}  # in the order they connected
        self.refused: Counter[str] = Counter()  # 503s: connections, requests
        self.closed: Counter[str] = Counter()  # closed by us: idle, write
        self._scrapes = 0

    def report(self, out: SampleSink) -> None:
        """Self metrics, added to the exporter's own snapshot."""
        out.add(selfmetrics.HTTP_CONNECTIONS, len(self.open))
        out.add(selfmetrics.HTTP_CONNECTION_LIMIT, self.max_connections)
        for reason in ("connections", "requests"):
            out.add(selfmetrics.HTTP_REFUSED, self.refused[reason], reason=reason)
        for reason in ("idle", "write", "evicted"):
            out.add(selfmetrics.HTTP_CLOSED, self.closed[reason], reason=reason)
        for kind in httplog.KINDS:
            out.add(selfmetrics.HTTP_CLIENT_ERRORS, httplog.CLIENT_ERRORS.counts[kind], kind=kind)

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: Guarded(factory(), self)

    def scrape_limit(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        """A middleware for /metrics: at most max_requests in flight."""
        limit = self.settings.max_requests

        @web.middleware
        async def limited(request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
            if request.path != "/metrics":
                return await handler(request)
            if self._scrapes >= limit:
                self.refused["requests"] += 1
                return web.Response(status=503, text=f"more than {limit} scrapes at once; try again\n",
                                    headers={"Retry-After": "1"})
            self._scrapes += 1
            try:
                return await handler(request)
            finally:
                self._scrapes -= 1

        return limited


@web.middleware
async def identity_bodies_only(request: web.Request,
                               handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """415 (with Accept-Encoding: identity, as RFC 9110 15.5.16 asks) to a request whose body has a content
    coding, before auth or a handler; the connection is closed after it, the body never decoded."""
    codings = {coding.strip().lower() for field in request.headers.getall(hdrs.CONTENT_ENCODING, ())
               for coding in field.split(",")}
    if codings <= {"", IDENTITY}:
        return await handler(request)
    httplog.CLIENT_ERRORS.counts["bad_request"] += 1
    refused = web.Response(status=415, text=f"request bodies are taken as they are (Content-Encoding: {IDENTITY}); "
                                            "send this one uncompressed\n",
                           headers={hdrs.ACCEPT_ENCODING: IDENTITY})
    refused.force_close()
    return refused


class Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard's bounds around it."""

    def __init__(self, inner: Any, guard: Guard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._tail = b""
        self._admitted = False
        self._silent = True  # nothing received yet: the first to go when room is needed
        self._connected_at = 0.0
        self._partial_since: float | None = None  # when its request's headers began (None: not in them)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._connected_at = asyncio.get_running_loop().time()
        if len(self.guard.open) >= self.guard.max_connections and not self._evict_a_silent_one():
            self.guard.refused["connections"] += 1
            transport.write(BUSY)  # type: ignore[attr-defined]
            transport.close()
            return
        self._admitted = True
        self.guard.open[self] = None
        self.inner.connection_made(transport)
        self._arm()

    def _evict_a_silent_one(self) -> bool:
        cutoff = self._connected_at - EVICTABLE_AFTER_S
        chosen = next((other for other in self.guard.open if other._silent and other._connected_at <= cutoff), None)
        if chosen is None:
            partial = [other for other in self.guard.open
                       if other._partial_since is not None and other._partial_since <= cutoff]
            chosen = min(partial, key=lambda other: other._partial_since or 0.0, default=None)
        if chosen is None:
            return False
        chosen._expire("evicted")
        self.guard.open.pop(chosen, None)  # its connection_lost comes later; its place is free now
        return True

    def _arm(self) -> None:
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.guard.settings.idle_timeout_seconds, self._expire, "idle")

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, why: str) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.guard.closed[why] += 1
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        self._silent = False
        seen = self._tail + data
        if HEADERS_END in seen:
            self._disarm()  # a whole header block: the request is aiohttp's now (its keep-alive bound follows)
            self._partial_since = None
        else:
            self._arm()  # the first bytes of a request (or its body): the clock runs until a header completes
            if self._partial_since is None:
                self._partial_since = asyncio.get_running_loop().time()
        self._tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self._admitted else None

    def pause_writing(self) -> None:
        if self._admitted:
            loop = asyncio.get_running_loop()
            self._write_timer = loop.call_later(self.guard.settings.write_timeout_seconds, self._expire, "write")
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        if self._admitted:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        if self._admitted:
            self.guard.open.pop(self, None)
            self.inner.connection_lost(exc)


def backlog(asked: int, guard: Guard) -> int:
    """asyncio accepts up to `backlog` connections per wake-up before any reaches the cap: a smaller one
    keeps a burst from taking the file descriptors the cap exists to save."""
    return min(asked, max(4, guard.max_connections // 2))


class GuardedTCPSite(web.TCPSite):
    """aiohttp's TCPSite (its start() with the protocol factory guarded), bound as exporter/serving/binding.py says."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: Guard, **kwargs: Any) -> None:
        super().__init__(runner, host, port, reuse_address=REUSE_ADDRESS, **kwargs)
        self._guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        assert self._runner.server is not None
        tls = {"ssl": self._ssl_context, "ssl_handshake_timeout": self._guard.settings.idle_timeout_seconds} \
            if self._ssl_context is not None else {}
        self._server = await loop.create_server(self._guard.wrap(self._runner.server), self._host, self._port,
                                                backlog=backlog(self._backlog, self._guard),
                                                reuse_address=self._reuse_address, reuse_port=self._reuse_port, **tls)
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port


class GuardedUnixSite(web.UnixSite):
    """aiohttp's UnixSite, guarded the same way."""

    def __init__(self, runner: web.BaseRunner, path: str, guard: Guard) -> None:
        super().__init__(runner, path)
        self._guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        assert self._runner.server is not None
        self._server = await loop.create_unix_server(self._guard.wrap(self._runner.server), self._path,
                                                     backlog=backlog(self._backlog, self._guard))


def runner_options(settings: HttpSettings) -> dict[str, Any]:
    """aiohttp's own keep-alive bound (its default keeps an idle connection an hour) closes a connection
    idle between requests; a second after ours, so that one that never sent a request is ours to count.
    Request bodies are never decompressed (see `identity_bodies_only`)."""
    return {"keepalive_timeout": settings.idle_timeout_seconds + 1, "auto_decompress": False}
