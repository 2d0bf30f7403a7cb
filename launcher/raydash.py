"""The launcher's one HTTP helper for a Ray dashboard's REST API (version, nodes, State API), with
the cluster's token. Submitting, following and stopping jobs goes through Ray's own Jobs client
(launcher/jobs.py); this covers what that client does not offer.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

Filter = tuple[str, str, str]  # (key, "=" | "!=", value), as the State API takes them
STATE_LIMIT = 10_000  # the State API's own ceiling


class DashboardHttpError(OSError):
    """The dashboard answered with an error status (the body's start is in the message)."""

    def __init__(self, path: str, status: int, body: bytes) -> None:
        super().__init__(f"{path} answered HTTP {status}: {body[:200]!r}")
        self.status = status


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """urllib would send the Authorization header on to wherever a redirect points: a 3xx is answered as is."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _tls(verify: bool | str | None) -> ssl.SSLContext | None:
    """The TLS context of `verify` as Ray's clients take it: True/None (default), False, or a CA file/dir."""
    if verify is None or verify is True:
        return None
    if verify is False:  # asked for with --verify false, as Ray's client takes it
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(**({"capath": verify} if os.path.isdir(verify) else {"cafile": verify}))


class RayDashboard:
    def __init__(self, address: str, token: str | None, headers: dict[str, str] | None = None,
                 verify: bool | str | None = None) -> None:
        self.address = address.rstrip("/")
        self.token = token
        self.headers = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
        self._tls = _tls(verify)

    def get(self, path: str, timeout: float = 10) -> tuple[int, bytes]:
        """(HTTP status, body) of GET address+path; OSError when the dashboard cannot be reached."""
        request = urllib.request.Request(self.address + path, headers=self.headers)
        opener = _OPENER if self._tls is None else urllib.request.build_opener(
            _NoRedirects, urllib.request.HTTPSHandler(context=self._tls))
        try:
            with opener.open(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def get_json(self, path: str, timeout: float = 10) -> Any:
        """The JSON body of a 200; DashboardHttpError for another status, ValueError for a non-JSON body."""
        status, body = self.get(path, timeout)
        if status != 200:
            raise DashboardHttpError(path, status, body)
        return json.loads(body)

    def state_list(self, resource: str, filters: Sequence[Filter] = (), timeout: float = 10) -> list[dict[str, Any]]:
        """`/api/v0/<resource>` rows (nodes, actors, ...) with detail."""
        params = [("limit", str(STATE_LIMIT)), ("detail", "1")]
        for key, predicate, value in filters:
            params += [("filter_keys", key), ("filter_predicates", predicate), ("filter_values", value)]
        reply = self.get_json(f"/api/v0/{resource}?{urllib.parse.urlencode(params)}", timeout)
        return reply["data"]["result"]["result"]
