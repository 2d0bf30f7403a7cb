"""Secrets out of what is shown or logged: credentials in URLs, header values."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

REDACTED = "<redacted>"

# In free text (a library's log line): the user:password@ of a URL and a URL's or path's query,
# which is where API keys travel (`.../v1/metrics?api_key=X`, `url: /v1/metrics?api_key=X`).
_USERINFO = re.compile(r"(?<=//)[^/\s@'\"]+@")
_QUERY = re.compile(r"(?<=[\w/.:\]-])\?[^\s'\"()<>]+")


def url(value: str) -> str:
    """The URL without its user:password@ (and without a query, where API keys tend to travel)."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = REDACTED if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def values(mapping: Mapping[str, str]) -> dict[str, str]:
    """The keys as they are, every value hidden (HTTP headers, environment variables)."""
    return dict.fromkeys(mapping, REDACTED)


def urls_in(text: str) -> str:
    """Free text with every URL's user:password@ and every query string hidden."""
    return _QUERY.sub("?" + REDACTED, _USERINFO.sub(REDACTED + "@", text))


class UrlCredentialsFilter(logging.Filter):
    """Rewrites a record's message and traceback through urls_in before any handler sees them."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is left for logging's own error handling
            return True
        record.msg, record.args = urls_in(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = urls_in(record.exc_text)
        return True


# The loggers opentelemetry's OTLP/HTTP exporters report failed requests on; requests' errors
# quote the URL they were sent to, query included.
OTEL_EXPORT_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.metric_exporter",
                       "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                       "opentelemetry.exporter.otlp.proto.http._common",
                       "opentelemetry.exporter.otlp.common.http",
                       "opentelemetry.sdk.metrics._internal.export",
                       "opentelemetry.sdk.trace.export",
                       "opentelemetry.sdk._shared_internal")


def guard_loggers(names: Iterable[str] = OTEL_EXPORT_LOGGERS) -> None:
    """Put UrlCredentialsFilter on these loggers (a logger's filters do not reach its children,
    so each one that logs is named); adding it twice is a no-op."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, UrlCredentialsFilter) for existing in logger.filters):
            logger.addFilter(UrlCredentialsFilter())
