"""What the HTTP servers log about clients. aiohttp logs every malformed request and every client that
goes away mid-request as an ERROR with a traceback; on a port anyone can reach that is noise an
attacker controls. Those are counted by kind (raypulse_exporter_http_client_errors_total) and said
in one WARNING line per interval, without a traceback; a real bug in a handler keeps its traceback.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import Counter

from aiohttp.http_exceptions import HttpProcessingError

INTERVAL_S = 60.0
KINDS = ("bad_request", "disconnect", "tls", "timeout")


def client_error_kind(exc: BaseException | None) -> str | None:
    """The bounded kind of a client's mistake or departure; None for anything else."""
    if isinstance(exc, HttpProcessingError):
        return "bad_request"
    if isinstance(exc, ssl.SSLError):
        return "tls"
    if isinstance(exc, (ConnectionError, asyncio.CancelledError, EOFError)):
        return "disconnect"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return None


class ClientErrors(logging.Filter):
    def __init__(self, interval: float = INTERVAL_S) -> None:
        super().__init__()
        self.interval = interval
        self.counts: Counter[str] = Counter()  # since the exporter started, by kind
        self._since_said = 0
        self._said_at = -float("inf")

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        kind = client_error_kind(exc)
        if kind is None:
            # Not a client's doing: kept whole, at the level the root logger lets through (this logger
            # listens at DEBUG only so that aiohttp's debug-level client errors are counted too).
            return record.levelno >= logging.getLogger().getEffectiveLevel()
        self.counts[kind] += 1
        self._since_said += 1
        now = time.monotonic()
        if now - self._said_at < self.interval:
            return False
        detail = " ".join(str(exc).split())[:200]  # aiohttp's messages span lines
        record.msg = (f"{self._since_said} client error(s) since the last such line (malformed requests, "
                      f"clients that went away); the latest: {kind}: {type(exc).__name__}: {detail}")
        record.args, record.exc_info, record.exc_text = (), None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        self._said_at, self._since_said = now, 0
        return True


CLIENT_ERRORS = ClientErrors()
LOGGER = logging.getLogger("raypulse.http")
LOGGER.setLevel(logging.DEBUG)
LOGGER.addFilter(CLIENT_ERRORS)
