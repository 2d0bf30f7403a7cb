"""A small client for the Ray dashboard's REST API (Jobs API, State API, node views) over aiohttp.

One `DashboardSession` per collection run: the collectors run on the event loop, a session is
cheap on a LAN, and nothing is left open between runs (a collector's `close()` is synchronous).
Every failure becomes a `DashboardError` whose `kind` is a bounded label value; a caller that
gets `unreachable` knows Ray is down and omits its Ray series rather than serving old ones.
The Ray token goes only where `LocalRay.dashboard` allows (see localray.py), and redirects are
never followed: a 3xx is an error, so the token cannot be carried on to another address.

Large replies are parsed in a worker thread by jsonparse.loads, which hands the GIL back between
rows: a reply of megabytes never stalls the event loop (and /healthz) for its whole parse.

The State API returns at most 10,000 rows per read, and its data source (the GCS) stops after
10,000 matches of the filters it applies itself (actors: actor_id, job_id, state; tasks: job_id,
state, name, task_id, actor_id); the dashboard applies every filter again after that. `StateList`
says whether a reply holds every matching row, from the counts Ray sends with it (Ray 2.60,
dashboard/state_aggregator.py): actors, nodes and placement groups report in `total` everything the
GCS holds and in `num_after_truncation` what it looked at, so fewer means it stopped; tasks report in
`total` the rows returned plus the events dropped (attempts Ray lost and matches past the limit), so
only a reply of the full 10,000 rows may be cut. `num_filtered` is what matched after every filter,
of which `limit` came back.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from exporter.collectors.ray import jsonparse
from exporter.collectors.ray.localray import LocalRay, Raylet, warn_once
from exporter.contract import wire

log = logging.getLogger(__name__)

ERROR_KINDS = ("unreachable", "timeout", "unauthorized", "http", "invalid")
# The State API's own ceiling (RAY_MAX_LIMIT_FROM_API_SERVER); asking for more is an error.
STATE_LIMIT = 10_000
# What the GCS returns at most for one read (RAY_MAX_LIMIT_FROM_DATA_SOURCE), whatever `limit` says.
SOURCE_LIMIT = 10_000
INLINE_JSON_BYTES = 64 * 1024  # a smaller reply parses in well under a millisecond: on the loop

Filter = tuple[str, str, str]  # (key, "=" | "!=", value)


class DashboardError(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        assert kind in ERROR_KINDS, kind
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass(frozen=True)
class StateList:
    """One State API read: the rows that came back and Ray's counts of what there was (module docstring)."""

    resource: str
    items: list[dict[str, Any]]
    total: int
    num_after_truncation: int
    num_filtered: int

    @property
    def source_cut(self) -> bool:
        """The GCS stopped at its limit: rows that match may never have been looked at."""
        if self.resource == "tasks":
            return self.num_after_truncation >= SOURCE_LIMIT
        return self.num_after_truncation < self.total

    @property
    def complete(self) -> bool:
        """Every row that matches the filters came back."""
        return not self.source_cut and len(self.items) >= self.num_filtered

    @classmethod
    def parse(cls, resource: str, result: Any) -> StateList:
        if not isinstance(result, dict):
            raise DashboardError("invalid", f"/api/v0/{resource}: no result in the reply")
        items = result.get("result")
        items = [row for row in items if isinstance(row, dict)] if isinstance(items, list) else []
        return cls(resource, items, _count(result.get("total")), _count(result.get("num_after_truncation")),
                   _count(result.get("num_filtered"), len(items)))


def _count(value: object, default: int = 0) -> int:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return default


class Cuts:
    """The reads of one run that Ray cut short: counted per resource, described for one warning."""

    def __init__(self) -> None:
        self.by_resource: dict[str, int] = {}
        self.what: list[str] = []

    def add(self, resource: str, what: str) -> None:
        self.by_resource[resource] = self.by_resource.get(resource, 0) + 1
        self.what.append(what)

    def check(self, reply: StateList, what: str) -> StateList:
        """Note `reply` if it is not whole; returns it."""
        if not reply.complete:
            self.add(reply.resource, f"{what}: {len(reply.items)} rows of {reply.num_filtered} matching"
                     + (f", the GCS stopped after {reply.num_after_truncation:,} of {reply.total:,}"
                        if reply.source_cut else ""))
        return reply

    def warn(self) -> None:
        if self.what:
            shown = "; ".join(self.what[:4]) + (f"; and {len(self.what) - 4} more" if len(self.what) > 4 else "")
            log.warning("Ray's State API cut %d read(s) of this run at its 10,000-row limit (%s): the series "
                        "built from them are left out, not taken for the whole", len(self.what), shown)


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
        self.bytes_read = 0  # what this session's replies weighed

    async def __aenter__(self) -> DashboardSession:
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers,
                                              connector=aiohttp.TCPConnector(limit=16))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._session is not None
        await self._session.close()

    async def _get(self, url: str, params: Sequence[tuple[str, str]] | Mapping[str, str] = ()) -> bytes:
        assert self._session is not None, "use `async with`"
        path = url.removeprefix(self.base_url)
        async with self._limit:
            try:
                async with self._session.get(url, params=params or None, allow_redirects=False) as response:
                    body = await response.read()
                    if 300 <= response.status < 400:
                        raise DashboardError("http", f"{response.status} from {path} redirects to "
                                             f"{response.headers.get('Location', '?')[:200]}; redirects are not "
                                             "followed (the Ray token stays here): set --ray-dashboard to where "
                                             "the dashboard is")
                    if response.status in (401, 403):
                        raise DashboardError("unauthorized", f"{response.status} from {path}: set RAY_AUTH_TOKEN "
                                             "(or RAY_AUTH_TOKEN_PATH) to the cluster's token")
                    if response.status >= 400:
                        raise DashboardError("http", f"{response.status} from {path}: "
                                             f"{body[:200].decode(errors='replace')}")
                    self.bytes_read += len(body)
                    return body
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise self._error(exc, url) from None

    def _error(self, exc: BaseException, url: str) -> DashboardError:
        """One reason per transport failure (the collectors count errors by it)."""
        where = url.removeprefix(self.base_url)
        if isinstance(exc, TimeoutError):
            return DashboardError("timeout", f"{where} took longer than {self._timeout.total:g}s")
        if isinstance(exc, aiohttp.ClientConnectionError):
            return DashboardError("unreachable", f"{url}: {exc}")
        return DashboardError("http", f"{where}: {exc}")

    async def text(self, path: str, params: Sequence[tuple[str, str]] | Mapping[str, str] = ()) -> str:
        return (await self._get(self.base_url + path, params)).decode(errors="replace")

    async def json(self, path: str, params: Sequence[tuple[str, str]] | Mapping[str, str] = ()) -> Any:
        body = await self._get(self.base_url + path, params)
        try:
            if len(body) <= INLINE_JSON_BYTES:
                return json.loads(body)
            return await asyncio.to_thread(_parse, body)
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
        return StateList.parse(resource, await self._state(f"/api/v0/{resource}", params))

    async def count(self, resource: str, filters: Sequence[Filter]) -> StateList:
        """How many rows match, without the rows: a read of one row, for Ray's counts beside it."""
        return await self.state_list(resource, filters, limit=1)

    async def summary(self, resource: str, filters: Sequence[Filter] = ()) -> tuple[dict[str, dict[str, Any]],
                                                                                   StateList]:
        """`/api/v0/<resource>/summarize`: name -> {..., "state_counts": {STATE: n}} over one list of at most
        10,000 rows, and that list's counts (whether it held every row)."""
        result = await self._state(f"/api/v0/{resource}/summarize", _filter_params(filters))
        try:
            summary = result["result"]["node_id_to_summary"]["cluster"]["summary"]
        except (KeyError, TypeError):
            raise DashboardError("invalid", f"/api/v0/{resource}/summarize: unexpected shape") from None
        counts = StateList.parse(resource, {**result, "result": []})
        return (summary if isinstance(summary, dict) else {}), counts

    async def metrics_text(self, url: str) -> str:
        """A Prometheus endpoint of Ray's (the metrics agent): never sent the Ray token."""
        async with self._limit:
            try:
                async with aiohttp.request("GET", url, timeout=self._timeout, allow_redirects=False) as response:
                    if response.status != 200:
                        raise DashboardError("http", f"{response.status} from {url}")
                    body = await response.read()
                    self.bytes_read += len(body)
                    return body.decode(errors="replace")
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise self._error(exc, url) from None


def _parse(body: bytes) -> Any:
    return jsonparse.loads(body.decode())


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
