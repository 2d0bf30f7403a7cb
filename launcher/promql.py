"""The one client of the user's Prometheus HTTP API (`/api/v1/query`, `/api/v1/query_range`): what a
report reads of a run submitted with `--prometheus URL` and what the health watcher reads with
`health.source: prometheus` (launcher/health/promql.py).

A Prometheus is foreign input like an exporter, so every request goes through the launcher's one
bounded reader (launcher/health/exporters.py `get`): one deadline for the whole request, caps on the
bytes on the wire and on what they inflate to, no redirect followed. The answer is parsed strictly
(the models below: the API's documented envelope and result shapes, nothing else) or refused whole.

Credentials: a URL's user and password (`https://user:pass@prom:9090`) are sent as basic auth, only to
that host, and never shown: every message names the URL without them (`shown`).
"""

from __future__ import annotations

import base64
import ssl
import urllib.parse
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from launcher.health.exporters import ReadError, get

TIMEOUT_S = 30.0  # a report's range queries: one per run, seconds are fine
# A report's range query of a large run's families is tens of MB; gzip (always asked for) makes it a few.
MAX_WIRE_BYTES = 64 * 2**20
MAX_INFLATED_BYTES = 256 * 2**20
MAX_LABEL_CHARS = 4096


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Labels = dict[Annotated[str, Field(max_length=MAX_LABEL_CHARS)], Annotated[str, Field(max_length=MAX_LABEL_CHARS)]]
# A sample as the API writes it: [unix time, "value"] (the value a string, "NaN" and "+Inf" among them),
# parsed to two numbers.
Point = tuple[float, float]


class VectorSample(_Answer):
    metric: Labels
    value: Point


class MatrixSeries(_Answer):
    metric: Labels
    values: list[Point]


# (the field names are the API's own)
class _Vector(_Answer):
    resultType: Literal["vector"]
    result: list[VectorSample]


class _Matrix(_Answer):
    resultType: Literal["matrix"]
    result: list[MatrixSeries]


class _Reply(_Answer):
    """The envelope of every /api/v1 answer (https://prometheus.io/docs/prometheus/latest/querying/api/)."""

    status: Literal["success", "error"]
    data: Annotated[_Vector | _Matrix, Field(discriminator="resultType")] | None = None
    errorType: str | None = None
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)
    infos: list[str] = Field(default_factory=list)  # Prometheus 3's


class PrometheusError(ReadError):
    """A query that gave no usable answer; the message names the Prometheus (without credentials) and why."""


class _Credentials:
    """The basic auth of a URL's user:password, as the bounded reader takes an exporter's (authorization())."""

    def __init__(self, user: str, password: str) -> None:
        self._header = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def ssl_context(self) -> ssl.SSLContext | None:
        return None  # the system's trust, as for any https URL

    def authorization(self) -> str:
        return self._header

    def __repr__(self) -> str:
        return "_Credentials(<redacted>)"


class Prometheus:
    """One Prometheus, by its base URL (credentials in it become basic auth)."""

    def __init__(self, url: str, *, timeout: float = TIMEOUT_S, max_wire_bytes: int = MAX_WIRE_BYTES,
                 max_inflated_bytes: int = MAX_INFLATED_BYTES) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"prometheus: {shown(url)!r} is not a Prometheus URL like http://prometheus:9090")
        netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        netloc += f":{parts.port}" if parts.port else ""
        self._base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self._access = _Credentials(urllib.parse.unquote(parts.username or ""),
                                    urllib.parse.unquote(parts.password or "")) if parts.username else None
        self.timeout = timeout
        self.max_wire_bytes = max_wire_bytes
        self.max_inflated_bytes = max_inflated_bytes

    @property
    def shown(self) -> str:
        """The base URL as messages name it: without the credentials."""
        return self._base

    def query(self, expr: str, *, timeout: float | None = None) -> list[VectorSample]:
        """An instant query's samples, now; the expression must give a vector."""
        data = self._get("/api/v1/query", {"query": expr}, timeout)
        if not isinstance(data, _Vector):
            raise PrometheusError(f"Prometheus {self.shown}: {expr!r} gave a {data.resultType}, not an instant vector")
        return data.result

    def query_range(self, expr: str, start: float, end: float, step: float, *,
                    timeout: float | None = None) -> list[MatrixSeries]:
        data = self._get("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{step:g}"}, timeout)
        if not isinstance(data, _Matrix):
            raise PrometheusError(f"Prometheus {self.shown}: a range query gave a {data.resultType}, not a matrix")
        return data.result

    def _get(self, path: str, params: dict[str, str], timeout: float | None) -> _Vector | _Matrix:
        url = f"{self._base}{path}?{urllib.parse.urlencode(params)}"
        try:
            body = get(url, self._access, timeout or self.timeout, accept_gzip=True,  # type: ignore[arg-type]
                       max_wire_bytes=self.max_wire_bytes, max_inflated_bytes=self.max_inflated_bytes)
        except ReadError as exc:
            hint = " (redirects are not followed: give --prometheus the URL it redirects to)" \
                if str(exc).startswith("HTTP 3") else ""
            raise PrometheusError(f"Prometheus {self.shown}: {exc}{hint}") from None
        try:
            reply = _Reply.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the answer"
            raise PrometheusError(f"Prometheus {self.shown}: not an HTTP API answer ({where}: {first['msg']}); "
                                  "is the URL Prometheus's base URL?") from None
        if reply.status != "success" or reply.data is None:
            raise PrometheusError(f"Prometheus {self.shown}: {reply.errorType or 'error'}: {reply.error or 'no data'}")
        return reply.data


def shown(url: str) -> str:
    """A URL as messages name it: its credentials left out."""
    parts = urllib.parse.urlsplit(url)
    if not parts.username and not parts.password:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
