"""On the Ray head: every node's health digest in one document (wire.FLEET_PATH), so that a launcher
watching a run of thousands of nodes reads one answer per check, not one per node.

The head's exporter gathers the digest (exporter/contract/digest.py) of every node its /sd lists, a
round every `interval` seconds while someone asks (a gatherer nobody read for IDLE_STOP_S stops until
asked again). Each read is conditional (an unchanged node is a 304), bounded (MIN_PARALLEL to
MAX_PARALLEL reads at once, a deadline per node that never holds up the others, a round of at most an
interval, a cap on a digest's bytes, one budget for all of them kept) and strictly parsed: a node
is foreign input, and one that cannot be read is an entry saying why, never a missing one.

Each entry carries the number of the change that last made it what it is (one sequence for the whole
fleet, so a document served in the middle of a round misses nothing of the rest of it);
`?since=CURSOR` answers only the entries changed after that cursor (the whole list when the nodes
listed changed since, or the cursor is of another process or unknown). Documents are joined and compressed off the loop.

The gathering runs on a thread and an event loop of its own (FleetThread, started at the first ask): a
round handles thousands of answers, and on the exporter's own loop each of them is a wait for /healthz,
/metrics and the progress reports. Here they wait at most for the interpreter's switch interval, and for
the garbage collector: the connections kept to 10,000 nodes are ~300,000 objects, which a full collection
walks for ~200 ms with every thread stopped (measured with bench/fleet_watch.py). So what survives a round
is frozen (gc.freeze: out of the collector's walks) and unfrozen and collected once every UNFREEZE_EVERY_S,
so that a cycle among what was frozen is freed within that time: one such pause an hour.
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import json
import logging
import resource
import secrets
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pydantic import ValidationError

from exporter.contract import digest, wire

log = logging.getLogger(__name__)

GATHER_INTERVAL_S = 10.0  # the launcher's default check interval: a round per check (an asker may say its own)
MIN_GATHER_INTERVAL_S = 1.0
READ_TIMEOUT_S = 2.0  # per node, from when its read starts (not while it waits for a slot)
# Reads at once, however many nodes /sd lists. Few: the responses being handled at once are what a /healthz
# waits behind on the loop, and on a LAN more do not make a round shorter. A round that ran out of its
# interval (nodes slow to answer) doubles them for the next, up to MAX_PARALLEL; one done in half halves them.
MIN_PARALLEL = 16
MAX_PARALLEL = 64  # also the sockets in use at once
IDLE_STOP_S = 300.0
STALE_AFTER_INTERVALS = 2.0
UNFREEZE_EVERY_S = 3600.0
FIRST_ROUND_WAIT_S = 2.5  # a first ask waits this long for the first round (a launcher's read deadline is 3 s)
MAX_FLEET_BYTES = 64 * 2**20  # every digest kept, together: a node past it is an entry that says so
MAX_ERROR_CHARS = 160

Listing = Callable[[], list[tuple[str, str]] | None]  # (node, host:port) of every node's exporter; None: unknown


@dataclass
class _Node:
    name: str
    target: str
    rev: int  # the change (self._changes) that last changed its entry
    etag: str | None = None
    body: bytes | None = None  # its last digest, as it sent it (parsed, strict, before it was kept)
    error: str | None = digest.NOT_READ_YET
    answered: bool = False
    checked_at: float = 0.0  # when it last answered the head (loop time)
    failed: bool = False  # the last read of it failed (one not reached in a round is not a failed one)
    entry: bytes = field(default=b"", repr=False)  # its entry in a document, made when it changes

    def render(self) -> None:
        head = {"node": self.name, "target": self.target, "error": self.error, "answered": self.answered}
        text = json.dumps(head, separators=(",", ":"))
        self.entry = (text[:-1] + ',"digest":').encode() + (self.body or b"null") + b"}"


class FleetGatherer:
    def __init__(self, listing: Listing, interval: float = GATHER_INTERVAL_S, timeout: float = READ_TIMEOUT_S,
                 max_parallel: int = MAX_PARALLEL, clock: Callable[[], float] = time.time) -> None:
        self._listing = listing
        self.interval = interval
        self.timeout = timeout
        self._max_parallel = max_parallel
        self.parallel = min(MIN_PARALLEL, max_parallel)  # readers in the next round
        self._clock = clock
        self.generation = secrets.token_hex(6)
        self.read_at: float | None = None
        self._nodes: dict[str, _Node] = {}  # by target
        self._changes = 0  # entries changed so far: a document's cursor
        self._listed_rev = 0  # the change at which the nodes listed last changed
        self._kept_bytes = 0
        self._asked_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._first_round = asyncio.Event()

    # --- serving -------------------------------------------------------------------------------------

    async def document(self, since: int | None, generation: str | None, gzipped: bool,
                       interval: float | None = None) -> bytes:
        """The fleet document for a reader whose last answer had `since` as its cursor; starts the rounds
        (a round every `interval` seconds from now on, at least MIN_GATHER_INTERVAL_S; None: as before)."""
        loop = asyncio.get_running_loop()
        self._asked_at = loop.time()
        if interval is not None:
            self.interval = max(MIN_GATHER_INTERVAL_S, interval)
        if self._task is None or self._task.done():  # the first ask, or the first since the rounds stopped
            self._forget_all()  # what was read before is stale: never served as now
            self._task = asyncio.create_task(self._run(), name="fleet-gatherer")
        if not self._first_round.is_set():
            try:
                async with asyncio.timeout(FIRST_ROUND_WAIT_S):
                    await self._first_round.wait()
            except TimeoutError:
                pass  # what is read so far; the rest say they are not read yet
        self._expire(loop.time())
        full = since is None or generation != self.generation or since < self._listed_rev or since > self._changes
        entries = [node.entry for node in self._nodes.values() if full or node.rev > since]  # type: ignore[operator]
        head = {"v": digest.VERSION, "generation": self.generation, "cursor": self._changes, "full": full,
                "listed": len(self._nodes), "read_at": self.read_at}
        return await asyncio.to_thread(_join, head, entries, gzipped)

    def _expire(self, now: float) -> None:
        """A digest the head has not read again for two rounds (a loop too busy to read it) is no longer
        served as the node's now: the entry says how old it is."""
        oldest = now - STALE_AFTER_INTERVALS * self.interval - self.timeout
        for node in self._nodes.values():
            if node.error is None and node.checked_at < oldest:
                self._update(node, None, None, f"not read for {now - node.checked_at:.0f}s")

    def _forget_all(self) -> None:
        self._nodes.clear()
        self._kept_bytes = 0
        self._changes = self._listed_rev = 0
        self._first_round.clear()
        self.generation = secrets.token_hex(6)  # a reader's cursor is of the rounds forgotten

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # --- gathering -----------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        session: aiohttp.ClientSession | None = None
        unfrozen_at = loop.time()
        try:
            while loop.time() - self._asked_at < IDLE_STOP_S:
                began = loop.time()
                listed = self._listing()
                if listed is not None:
                    self._relist(dict((target, name) for name, target in listed))
                keep = len(self._nodes) <= _sockets_to_keep()
                if session is None or session.connector is None or session.connector.force_close == keep:
                    if session is not None:
                        await session.close()
                    session = _session(self._max_parallel, keep)
                try:
                    await self._round(session)
                except Exception:  # a round that fails is logged; the next one tries again
                    log.exception("a round of reading the nodes' health digests failed")
                if loop.time() - unfrozen_at >= UNFREEZE_EVERY_S:
                    gc.unfreeze()
                    gc.collect()
                    unfrozen_at = loop.time()
                gc.freeze()  # the kept connections and nodes: out of the collector's walks (the docstring)
                self._first_round.set()
                await asyncio.sleep(max(0.0, self.interval - (loop.time() - began)))
        finally:
            if session is not None:
                await session.close()
            gc.unfreeze()  # no rounds, nothing held: the collector walks everything again

    async def _round(self, session: aiohttp.ClientSession) -> None:
        """Every node once, for at most an interval: nodes that time out cannot keep the others from being read,
        and a node not reached by then says so (and is read early in the next round)."""
        loop = asyncio.get_running_loop()
        ends = loop.time() + self.interval
        # Those that answered the last time they were asked first, least recently read first among them
        waiting = iter(sorted(self._nodes.values(), key=lambda node: (node.failed, node.checked_at)))

        late = False

        async def reader() -> None:  # `parallel` readers take the nodes in turn
            nonlocal late
            for node in waiting:
                if loop.time() >= ends:
                    late = True
                    self._update(node, None, None, f"not reached in the head's round of {self.interval:g}s")
                    continue
                await self._read(session, node)

        await asyncio.gather(*(reader() for _ in range(self.parallel)))
        self.read_at = self._clock()
        if late:
            self.parallel = min(self._max_parallel, self.parallel * 2)
        elif loop.time() < ends - self.interval / 2:
            self.parallel = max(min(MIN_PARALLEL, self._max_parallel), self.parallel // 2)

    def _relist(self, listed: Mapping[str, str]) -> None:
        changed = False
        for target in [target for target in self._nodes if target not in listed]:
            self._forget(self._nodes.pop(target))
            changed = True
        for target, name in listed.items():
            node = self._nodes.get(target)
            if node is None or node.name != name:
                if node is not None:
                    self._forget(node)
                self._changes += 1
                node = self._nodes[target] = _Node(name, target, self._changes)
                node.render()
                changed = True
        if changed:
            self._changes += 1
            self._listed_rev = self._changes

    def _forget(self, node: _Node) -> None:
        self._kept_bytes -= len(node.body or b"")

    async def _read(self, session: aiohttp.ClientSession, node: _Node) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                body, etag, error = await _get(session, node)
        except TimeoutError:
            body, etag, error = None, None, f"no answer within {self.timeout:g}s"
        node.failed = error is not None
        if error is None:
            node.checked_at = asyncio.get_running_loop().time()
        if error is None and body is not None and body != node.body and \
                self._kept_bytes - len(node.body or b"") + len(body) > MAX_FLEET_BYTES:
            body, error = None, f"the head keeps at most {MAX_FLEET_BYTES} bytes of digests"
        self._update(node, body, etag, error)

    def _update(self, node: _Node, body: bytes | None, etag: str | None, error: str | None) -> None:
        """A read's outcome into the node's entry: a new body (None: the same), or an error."""
        answered = node.answered or error is None
        if error is not None:
            body, etag = None, None  # what it served last is no longer what it serves
        elif body is None:
            body = node.body  # a 304
        if (body, error, answered) == (node.body, node.error, node.answered):
            node.etag = etag if error is None else None
            return
        self._kept_bytes += len(body or b"") - len(node.body or b"")
        self._changes += 1
        node.body, node.error, node.answered, node.etag, node.rev = body, error, answered, etag, self._changes
        node.render()


class FleetThread:
    """A FleetGatherer on a thread and event loop of its own, asked from the exporter's loop. The thread
    starts at the first ask (an exporter that is not the head never starts one) and is a daemon: an exporter
    that ends without `close()` is not held up by it."""

    def __init__(self, gatherer: FleetGatherer) -> None:
        self.gatherer = gatherer
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()

    async def document(self, since: int | None, generation: str | None, gzipped: bool,
                       interval: float | None = None) -> bytes:
        return await self._on_thread(self.gatherer.document(since, generation, gzipped, interval))

    async def close(self) -> None:
        if self._loop is None or self._thread is None:
            return
        await self._on_thread(self.gatherer.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join)
        self._loop.close()
        self._loop = self._thread = None

    async def _on_thread(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        with self._starting:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="fleet-gatherer", daemon=True)
                self._thread.start()
        # Cancelled here (the asker went away), it is cancelled there too.
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self._loop))


async def _get(session: aiohttp.ClientSession, node: _Node) -> tuple[bytes | None, str | None, str | None]:
    """(body or None for a 304, its ETag, error or None)."""
    headers = {"If-None-Match": node.etag} if node.etag and node.body is not None else {}
    try:
        async with session.get(f"http://{node.target}{wire.DIGEST_PATH}", headers=headers,
                               allow_redirects=False) as response:
            etag = response.headers.get("ETag")
            etag = etag if etag and len(etag) <= 200 and etag.isprintable() else None
            if response.status == 304 and headers:
                return None, etag or node.etag, None
            if response.status != 200:
                return None, None, f"HTTP {response.status}"
            if response.headers.get("Content-Encoding", "identity") != "identity":
                return None, None, "a digest in an encoding not asked for"
            body = await response.content.read(digest.MAX_DIGEST_BYTES + 1)
            if len(body) > digest.MAX_DIGEST_BYTES:
                return None, None, f"a digest of more than {digest.MAX_DIGEST_BYTES} bytes"
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        return None, None, _why(exc)
    try:
        digest.NodeDigest.model_validate_json(body)
    except ValidationError:
        return None, None, "a digest that does not parse"
    return body, etag, None


def _sockets_to_keep() -> int:
    """How many idle connections the head may keep open between rounds: half of its file descriptors (the
    exporter's own server takes at most a quarter, exporter/serving/guard.py; the rest is for its files)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2


def _session(max_parallel: int, keep_alive: bool) -> aiohttp.ClientSession:
    """The head's client: MAX_PARALLEL connections in use at once; between rounds one idle connection a node
    (a round then costs no connect, about a quarter of its CPU) when that many fit `_sockets_to_keep()`,
    else none."""
    connector = aiohttp.TCPConnector(limit=max_parallel, force_close=not keep_alive)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())


def _why(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, ConnectionRefusedError):
        exc = exc.os_error  # said as the launcher's own reads say it (digest.REFUSED)
    text = "".join(ch if ch.isprintable() else "?" for ch in str(exc))
    return f"{type(exc).__name__}: {text}"[:MAX_ERROR_CHARS] if text else type(exc).__name__


def _join(head: dict[str, Any], entries: list[bytes], gzipped: bool) -> bytes:
    text = json.dumps(head, separators=(",", ":"))
    body = (text[:-1] + ',"nodes":[').encode() + b",".join(entries) + b"]}"
    return gzip.compress(body, compresslevel=1) if gzipped else body


def listing_of(groups: Any) -> list[tuple[str, str]]:
    """(node, host:port) of every target of /sd's groups (the node is its `node` label, else its address)."""
    found = []
    for group in groups:
        labels = group.get("labels") or {}
        for target in group.get("targets") or ():
            found.append((str(labels.get("node") or target), str(target)))
    return found
