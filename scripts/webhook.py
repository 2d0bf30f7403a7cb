"""A real Alertmanager webhook receiver (aiohttp) that records what it is sent, for tests, the
drill and the demo. It runs its own event loop in a thread, so synchronous code can use it:

    with Webhook() as hook:                # listens on a free loopback port
        ...alertmanager posts to f"{hook.url}/pager"...
        hook.wait_for(lambda a: a.name == "RaypulseGpuLost", timeout=60)

Every alert of every notification becomes a Received (receiver = the URL path, e.g. "pager").
Payloads are Alertmanager's webhook format version 4 (0.25 and newer).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MAX_BODY = 4 * 2**20


@dataclass(frozen=True)
class Received:
    receiver: str
    status: str  # firing or resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str
    at: float = field(compare=False)  # time.time() when the notification arrived

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")


class Webhook:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self.payloads: list[dict[str, Any]] = []
        self.alerts: list[Received] = []
        self._lock = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _receive(self, request: web.Request) -> web.Response:
        if (request.content_length or 0) > MAX_BODY:
            return web.Response(status=413)
        try:
            payload = json.loads(await request.read())
        except ValueError:
            return web.Response(status=400, text="not JSON")
        now = time.time()
        receiver = request.path.strip("/") or "default"
        with self._lock:
            self.payloads.append({"receiver_path": receiver, "received_at": now, **payload})
            for alert in payload.get("alerts", []):
                self.alerts.append(Received(receiver, alert.get("status", ""), dict(alert.get("labels", {})),
                                            dict(alert.get("annotations", {})), alert.get("startsAt", ""), now))
            self._lock.notify_all()
        return web.Response(text="ok")

    def start(self) -> Webhook:
        started = threading.Event()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]  # the port the OS chose for port 0

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            app = web.Application(client_max_size=MAX_BODY)
            app.router.add_post("/{tail:.*}", self._receive)
            self._runner = web.AppRunner(app, access_log=None)
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.SockSite(self._runner, sock).start())
            started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="webhook", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the webhook receiver did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = None

    def __enter__(self) -> Webhook:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.alerts)

    def wait_for(self, predicate: Callable[[Received], bool], timeout: float, since: float = 0.0) -> Received | None:
        """The first alert received at or after `since` matching `predicate`, waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for alert in self.alerts:
                    if alert.at >= since and predicate(alert):
                        return alert
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)
