"""A small client for the Ray dashboard's REST API (Jobs API, State API, node views) over aiohttp.

One `DashboardSession` per collection run: the collectors run on the event loop, a session is
cheap on a LAN, and nothing is left open between runs (a collector's `close()` is synchronous).
Every failure becomes a `DashboardError` whose `kind` is a bounded label value; a caller that
gets `unreachable` knows Ray is down and omits its Ray series rather than serving old ones.
The Ray token goes only where `LocalRay.dashboard` allows (see localray.py), and redirects are
never followed: a 3xx is an error, so the token cannot be carried on to another address.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from exporter import wire
from exporter.collectors.ray.localray import LocalRay, Raylet, warn_once

log = logging.getLogger(__name__)

ERROR_KINDS = ("unreachable", "timeout", "unauthorized", "http", "invalid")
# The State API's own ceiling (RAY_MAX_LIMIT_FROM_API_SERVER); asking for more is an error.
STATE_LIMIT = 10_000

Filter = tuple[str, str, str]  # (key, "=" | "!=", value)


class DashboardError(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        assert kind in ERROR_KINDS, kind
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass(frozen=True)
class StateList:
    items: list[dict[str, Any]]
    truncated: bool  # the State API returned fewer rows than matched


def _filter_params(filters: Sequence[Filter]) -> list[tuple[str, str]]:
    params = []
    for key, predicate, value in filters:
        params += [("filter_keys", key), ("filter_predicates", predicate), ("filter_values", value)]
    return params


class DashboardSession:
    """`async with DashboardSession(url, timeout) as api:` then `await api.json(...)` etc."""

    def __init__(self, base_url: str, timeout_seconds: float, token: str | None = None,
                 concurrency: int = 8) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None
        self._limit = asyncio.Semaphore(concurrency)  # a run never floods the dashboard

    async def __aenter__(self) -> DashboardSession:
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers,
                                              connector=aiohttp.TCPConnector(limit=16))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._session is not None
        await self._session.close()

    async def text(self, path: str, params: Sequence[tuple[str, str]] | Mapping[str, str] = ()) -> str:
        assert self._session is not None, "use `async with`"
        url = self.base_url + path
        async with self._limit:
            try:
                async with self._session.get(url, params=params or None, allow_redirects=False) as response:
                    body = await response.text()
                    if 300 <= response.status < 400:
                        raise DashboardError("http", f"{response.status} from {path} redirects to "
                                             f"{response.headers.get('Location', '?')[:200]}; redirects are not "
                                             "followed (the Ray token stays here): set --ray-dashboard to where "
                                             "the dashboard is")
                    if response.status in (401, 403):
                        raise DashboardError("unauthorized", f"{response.status} from {path}: set RAY_AUTH_TOKEN "
                                             "(or RAY_AUTH_TOKEN_PATH) to the cluster's token")
                    if response.status >= 400:
                        raise DashboardError("http", f"{response.status} from {path}: {body[:200]}")
                    return body
            except TimeoutError:
                raise DashboardError("timeout", f"{path} took longer than {self._timeout.total:g}s") from None
            except aiohttp.ClientConnectionError as exc:
                raise DashboardError("unreachable", f"{url}: {exc}") from None
            except aiohttp.ClientError as exc:
                raise DashboardError("http", f"{path}: {exc}") from None

    async def json(self, path: str, params: Sequence[tuple[str, str]] | Mapping[str, str] = ()) -> Any:
        body = await self.text(path, params)
        try:
            return json.loads(body)
        except ValueError:
            raise DashboardError("invalid", f"{path} did not return JSON: {body[:100]!r}") from None

    async def _state(self, path: str, params: list[tuple[str, str]]) -> Any:
        reply = await self.json(path, params)
        if not isinstance(reply, dict) or not reply.get("result"):
            message = reply.get("msg") if isinstance(reply, dict) else reply
            raise DashboardError("invalid", f"{path}: {str(message)[:200]}")
        try:
            return reply["data"]["result"]
        except (KeyError, TypeError):
            raise DashboardError("invalid", f"{path}: no data.result in the reply") from None

    async def state_list(self, resource: str, filters: Sequence[Filter] = (), *, detail: bool = False,
                         limit: int = STATE_LIMIT) -> StateList:
        """`/api/v0/<resource>` (nodes, actors, tasks, placement_groups, ...)."""
        params = [("limit", str(limit)), ("detail", "1" if detail else "0"), *_filter_params(filters)]
        result = await self._state(f"/api/v0/{resource}", params)
        items = result.get("result") or []
        total = result.get("total") or 0
        return StateList(items, truncated=len(items) < total)

    async def summary(self, resource: str, filters: Sequence[Filter] = ()) -> dict[str, dict[str, Any]]:
        """`/api/v0/<resource>/summarize`: name -> {..., "state_counts": {STATE: n}} for the cluster."""
        result = await self._state(f"/api/v0/{resource}/summarize", _filter_params(filters))
        try:
            return result["result"]["node_id_to_summary"]["cluster"]["summary"]
        except (KeyError, TypeError):
            raise DashboardError("invalid", f"/api/v0/{resource}/summarize: unexpected shape") from None


_unreadable: set[str] = set()  # token files already warned about


def ray_token() -> str | None:
    """The Ray auth token where Ray looks for it (read on every session: a launcher may write it after
    the exporter starts); a named file that cannot be read is warned about once and sends none."""
    try:
        return wire.ray_auth_token()
    except wire.RayTokenUnreadable as exc:
        if str(exc.path) not in _unreadable:
            _unreadable.add(str(exc.path))
            log.warning("%s", exc)
        return None


def connect(local: LocalRay, raylets: list[Raylet] | None = None) -> DashboardSession:
    """A session to the dashboard this node belongs to, with the Ray token if there is one and that
    dashboard may have it (configured, or vouched for by a trusted raylet of this host)."""
    where = local.dashboard(raylets)
    token = ray_token()
    if token and not where.token:
        if where.why_not:
            warn_once(("token", where.url, where.why_not), "not sending the Ray token to the dashboard at %s: %s "
                      "(if it is your cluster's, name it with --ray-dashboard)", where.url, where.why_not)
        token = None
    return DashboardSession(where.url, local.settings.request_timeout_seconds, token)
