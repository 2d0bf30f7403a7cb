"""Secrets out of what is shown or logged: credentials in URLs, header values."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

REDACTED = "<redacted>"


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
