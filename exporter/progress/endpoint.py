"""The progress endpoint training code reports to: `POST /v1/progress` with a JSON batch
(the format is in store.py), on its own listener, loopback or a Unix socket by default.

    204  applied
    400  not valid; the body names the first bad field: {"error": "reports[2].loss: ..."}
    401  no token, or not the token of every report's job (where tokens are required)
    413  larger than progress.max_body_bytes
    415  not application/json, or a body with a Content-Encoding (compressed bodies are never read)
    429  would exceed progress.max_series, max_jobs, max_ranks_per_job or the job's max_job_share

Where Ray token authentication is on (progress.token auto) or progress.token is required, a report
is accepted only with `Authorization: Bearer <token>`, the token of the job it names
(wire.progress_token): a local process cannot write another job's step and loss.

It is a separate aiohttp site so that it never shares the /metrics port (or its auth) and so that
exposing /metrics on the network does not expose a write endpoint with it. If its address is
taken the exporter still serves metrics; `raypulse_train_endpoint_up` says 0.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from exporter.config import LISTEN_OFF, ProgressSettings, parse_listen
from exporter.contract import wire
from exporter.progress.store import ProgressStore, Rejected, Report, owner, parse_batch
from exporter.serving.guard import Guard, GuardedTCPSite, GuardedUnixSite, identity_bodies_only, runner_options

log = logging.getLogger(__name__)
PATH = wire.PROGRESS_PATH
BODY_TIMEOUT_S = 30.0  # the default http.idle_timeout_seconds; the endpoint passes the configured one


def _error(rejected: Rejected) -> web.Response:
    return web.json_response({"error": str(rejected)}, status=rejected.status)


async def _read_bounded(request: web.Request, limit: int) -> bytes | None:
    """The body, or None once it passes `limit` bytes (a chunked body is cut, never buffered whole)."""
    chunks, size = [], 0
    while chunk := await request.content.read(65536):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


# The key tokens are derived from (the Ray auth token); None: Ray token authentication is off. Raises
# TokenUnavailable when there should be one and it cannot be read.
TokenKey = Callable[[], str | None]


class TokenUnavailable(Exception):
    """The Ray auth token is named (RAY_AUTH_TOKEN_PATH) or was seen, and cannot be read now."""


class RayTokenKey:
    """The Ray auth token where Ray looks for it, read again when its file changes. None only while
    no file is named and none was ever found: then Ray token authentication is off, and so are
    progress tokens. A named file that cannot be read, or a token that was there and is gone (a
    rotation half done, a file moved away), raises TokenUnavailable: reports are refused until it
    is back, the check is never switched off by a missing file."""

    def __init__(self, read: Callable[[], str | None] = wire.ray_auth_token) -> None:
        self._read = read
        self.seen = False

    def __call__(self) -> str | None:
        try:
            token = self._read()
        except wire.RayTokenUnreadable as exc:
            raise TokenUnavailable(str(exc)) from None
        if token is None and self.seen:
            raise TokenUnavailable("the Ray auth token this exporter checked tokens with is no longer where Ray "
                                   "looks for it")
        self.seen = self.seen or token is not None
        return token


def check_token(mode: str, key: TokenKey, header: str | None, reports: list[Report]) -> None:
    """Raise Rejected(401) unless tokens are off or the header holds the token of every report's owner."""
    if mode == "off":
        return
    try:
        secret = key()
    except TokenUnavailable as exc:
        raise Rejected(401, "unauthorized", f"{exc}: reports are refused until it can be read again") from None
    if secret is None:
        if mode == "auto":
            return  # Ray token authentication is off: so are progress tokens
        raise Rejected(401, "unauthorized", "progress.token is required but this exporter has no Ray auth token "
                       "to check tokens with (set RAY_AUTH_TOKEN_PATH)")
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise Rejected(401, "unauthorized", f"a token is required: Authorization: Bearer <token>; the launcher "
                       f"gives every attempt its token in {wire.ENV_PROGRESS_TOKEN}")
    # As bytes: compare_digest refuses str with non-ASCII characters (a TypeError, once a 500). A header
    # that is not UTF-8 arrives with surrogate escapes; "replace" keeps it unequal to any hex token.
    presented = given.strip().encode("utf-8", "replace")
    for index, report in enumerate(reports):
        if not hmac.compare_digest(presented, wire.progress_token(secret, *owner(report)).encode()):
            kind, name = owner(report)
            raise Rejected(401, "unauthorized", f"reports[{index}]: the token is not the one of {kind} {name}")


def progress_app(store: ProgressStore, token_key: TokenKey | None = None,
                 body_timeout: float = BODY_TIMEOUT_S) -> web.Application:
    """`body_timeout`: seconds for a report's whole body once its headers came (a client that announced a body
    and sends none held a connection slot for as long as it liked; the guard bounds only headers)."""
    limit = store.settings.max_body_bytes
    mode = store.settings.token
    token_key = token_key or RayTokenKey()

    async def post(request: web.Request) -> web.Response:
        try:
            if request.content_type != "application/json":
                raise store.reject(Rejected(415, "unsupported_media_type",
                                            f"Content-Type must be application/json, not {request.content_type}"))
            if request.content_length is not None and request.content_length > limit:
                raise store.reject(Rejected(413, "too_large", f"body of {request.content_length} bytes is over "
                                            f"progress.max_body_bytes ({limit})"))
            try:
                async with asyncio.timeout(body_timeout):
                    body = await _read_bounded(request, limit)
            except TimeoutError:
                return web.json_response({"error": f"body: not whole within {body_timeout:g}s"}, status=408,
                                         headers={"Connection": "close"})
            if body is None:
                raise store.reject(Rejected(413, "too_large", f"body is over progress.max_body_bytes ({limit})"))
            try:
                data = json.loads(body)
            except (ValueError, RecursionError):
                raise store.reject(Rejected(400, "invalid", "body: not valid JSON")) from None
            try:
                reports = parse_batch(data)
                check_token(mode, token_key, request.headers.get("Authorization"), reports)
            except Rejected as rejected:
                raise store.reject(rejected) from None
            store.apply(reports)
        except Rejected as rejected:
            return _error(rejected)
        return web.Response(status=204)

    # client_max_size also bounds anything aiohttp itself would buffer; a compressed body is refused unread.
    app = web.Application(client_max_size=limit, middlewares=[identity_bodies_only])
    app.router.add_post(PATH, post)
    return app


class ProgressEndpoint:
    """Owns the listener; `start()` reports whether it is listening."""

    def __init__(self, settings: ProgressSettings, store: ProgressStore, guard: Guard,
                 token_key: TokenKey | None = None, logger: logging.Logger | None = None) -> None:
        self.settings = settings
        self.store = store
        self.guard = guard  # shared with /metrics: one bound on connections for the whole exporter
        self.token_key = token_key or RayTokenKey()  # one for the endpoint's life: it remembers a token seen
        self.logger = logger  # aiohttp's server logger (client errors are counted, not traced)
        self.socket_path: Path | None = None
        self.listening = False
        self.address: str | None = None  # where it listens, e.g. 127.0.0.1:9478 or unix:/run/x.sock
        self._runner: web.AppRunner | None = None

    async def start(self) -> bool:
        listen = self.settings.listen
        if listen == LISTEN_OFF:
            return False
        if self.settings.token == "required" and self._key_or_none() is None:
            log.error("progress.token is required but no Ray auth token is readable (RAY_AUTH_TOKEN, "
                      "RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token): the progress endpoint does not listen")
            return False
        extra = {"logger": self.logger} if self.logger is not None else {}
        runner = web.AppRunner(progress_app(self.store, self.token_key, self.guard.settings.idle_timeout_seconds),
                               access_log=None, handle_signals=False,
                               **runner_options(self.guard.settings), **extra)
        await runner.setup()
        try:
            if listen.startswith("unix:"):
                path = Path(listen.removeprefix("unix:"))
                if path.is_socket():
                    path.unlink()  # left over from an exporter that did not shut down
                site: web.BaseSite = GuardedUnixSite(runner, str(path), self.guard)
                await site.start()
                os.chmod(path, 0o660)  # the training processes run as this user or its group
                self.socket_path = path
                self.address = listen
            else:
                host, port = parse_listen(listen)
                site = GuardedTCPSite(runner, host, port, self.guard)
                await site.start()
                self.address = f"{host}:{runner.addresses[0][1]}"
        except OSError as exc:
            log.error("progress endpoint cannot listen on %s: %s; metrics are still served, training progress "
                      "is not (set --progress-listen)", listen, exc.strerror or exc)
            await runner.cleanup()
            return False
        self._runner = runner
        self.listening = True
        log.info("progress endpoint listening on %s%s", self.address, PATH)
        return True

    def _key_or_none(self) -> str | None:
        try:
            return self.token_key()
        except TokenUnavailable:
            return None

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.socket_path is not None:  # aiohttp leaves the socket file behind
            self.socket_path.unlink(missing_ok=True)
            self.socket_path = None
        self.listening = False
