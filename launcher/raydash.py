"""The launcher's one HTTP helper for a Ray dashboard's REST API (version, nodes, State API), with
the cluster's token, and the bounds every answer from a dashboard is read within. Submitting, following
and stopping jobs goes through Ray's own Jobs client (launcher/jobs.py), which reads its answers through
the same bounds (`bounded`); this covers what that client does not offer.

A dashboard is foreign input: every request has one deadline for its whole answer (a dashboard that drips
a byte at a time cannot hold the launcher: a socket timeout alone restarts with every byte, so the reads'
reaper cuts the connection at the deadline), an answer is read up to MAX_ANSWER_BYTES, and a redirect is
refused, never followed (the token and --headers would go with it). Each ends as an OSError.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

Filter = tuple[str, str, str]  # (key, "=" | "!=", value), as the State API takes them
STATE_LIMIT = 10_000  # the State API's own ceiling
READ_TIMEOUT_S = 10.0  # one read of the REST API, its whole answer (the version check, the State API)
CONNECT_TIMEOUT_S = 5.0
MAX_ANSWER_BYTES = 64 * 2**20  # a job's whole log (`launcher logs`) is the largest answer asked for


class DashboardHttpError(OSError):
    """The dashboard answered with an error status (the body's start is in the message)."""

    def __init__(self, path: str, status: int, body: bytes) -> None:
        super().__init__(f"{path} answered HTTP {status}: {body[:200]!r}")
        self.status = status


class RedirectRefused(OSError):
    """The dashboard answered with a redirect: never followed (the token and headers would go along)."""


def bounded(response: Any, deadline: float, timeout: float) -> Any:
    """A `requests` response hook (it runs before requests reads the body): the body read here, whole by the
    deadline and at most MAX_ANSWER_BYTES (decoded), or an OSError; a redirect refused."""
    if response.is_redirect:
        response.close()
        where = "".join(ch if ch.isprintable() else "?" for ch in response.headers.get("Location", ""))[:120]
        raise RedirectRefused(f"the Ray dashboard answered {response.status_code} to {where or 'elsewhere'}: a "
                              "redirect is not followed (the token and --headers would go with it); give the "
                              "address it names, if you trust it")
    # The exporters' bounded reader, loaded with the first answer read: its module brings the /metrics parser
    # and the health digest, which a command that asks no dashboard (`launcher status --help`) does not need.
    from launcher.health import exporters

    raw = response.raw
    expired = threading.Event()
    connection = getattr(raw, "connection", None)
    entry = exporters.cut_at(deadline, connection, expired) if connection is not None else None
    try:
        body = exporters.read_body(lambda size: raw.read1(size, decode_content=True),
                                   lambda: raw.length_remaining, None, expired, deadline, timeout,
                                   MAX_ANSWER_BYTES)
    except Exception as exc:  # noqa: BLE001 - foreign input: whatever the read raises is one OSError
        response.close()
        if expired.is_set():
            raise exporters.ReadError(f"the Ray dashboard gave no whole answer within {timeout:g}s") from None
        raise exporters.why(exc) from None
    finally:
        if entry is not None:
            exporters.forget_cut(entry)
    response._content = body  # what requests would have read itself (Response.content)
    response._content_consumed = True
    return response


def _innermost(exc: BaseException) -> BaseException:
    """The error a failed request started from (requests wraps urllib3's, which wraps the socket's)."""
    for _ in range(8):
        inner = next((candidate for candidate in (exc.__cause__, getattr(exc, "reason", None), *exc.args[:1])
                      if isinstance(candidate, BaseException) and candidate is not exc), None)
        if inner is None:
            break
        exc = inner
    return exc


class RayDashboard:
    def __init__(self, address: str, token: str | None, headers: dict[str, str] | None = None,
                 verify: bool | str | None = None) -> None:
        self.address = address.rstrip("/")
        self.token = token
        self.headers = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
        self.verify = True if verify is None else verify  # as requests takes it: a bool, or a CA file/dir

    def get(self, path: str, timeout: float | None = None) -> tuple[int, bytes]:
        """(HTTP status, body) of GET address+path, whole within `timeout` (READ_TIMEOUT_S); OSError when the
        dashboard cannot be reached, gives no whole answer in time or in MAX_ANSWER_BYTES, or redirects."""
        import requests  # with Ray's client; not for every launcher command

        timeout = READ_TIMEOUT_S if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            response = requests.get(self.address + path, headers=self.headers, verify=self.verify,
                                    timeout=(min(CONNECT_TIMEOUT_S, timeout), timeout), allow_redirects=False,
                                    hooks={"response": lambda answer, **_: bounded(answer, deadline, timeout)})
        except requests.RequestException as exc:  # an OSError already; its words are urllib3's nesting
            cause = _innermost(exc)
            raise OSError(getattr(cause, "strerror", None) or str(cause)) from None
        return response.status_code, response.content

    def get_json(self, path: str, timeout: float | None = None) -> Any:
        """The JSON body of a 200; DashboardHttpError for another status, ValueError for a non-JSON body."""
        status, body = self.get(path, timeout)
        if status != 200:
            raise DashboardHttpError(path, status, body)
        return json.loads(body)

    def state_list(self, resource: str, filters: Sequence[Filter] = (),
                   timeout: float | None = None) -> list[dict[str, Any]]:
        """`/api/v0/<resource>` rows (nodes, actors, ...) with detail."""
        params = [("limit", str(STATE_LIMIT)), ("detail", "1")]
        for key, predicate, value in filters:
            params += [("filter_keys", key), ("filter_predicates", predicate), ("filter_values", value)]
        reply = self.get_json(f"/api/v0/{resource}?{urllib.parse.urlencode(params)}", timeout)
        return reply["data"]["result"]["result"]
