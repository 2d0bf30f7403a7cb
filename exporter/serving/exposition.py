"""Snapshots to exposition bytes, rendered once per change and served as they are.

prometheus_client encodes const metric families (never a hand-written format). Each snapshot
is encoded once per format into a chunk that is kept while the snapshot is served, so a
collector's run re-encodes only its own families; a body is the chunks joined (a family lives
in one snapshot, so it is never split). The `Publisher` re-assembles the body when a collector
publishes or a snapshot goes stale, off the event loop, and swaps it in; a scrape only picks
the bytes for its format. Only formats scraped in the last few minutes are assembled ahead
(Prometheus asks for OpenMetrics, a curl for text); the first scrape of another format
assembles it once, in a worker thread like every rendering: the event loop never renders and
never waits on the chunk cache's lock.

A selection (`/metrics?name[]=...`, exporter/serving/server.py) is the same body with only the named families:
made from the same per-family chunks (only the named ones are encoded), once per change of the served
snapshots for each set asked for, when it is first asked for after the change, and kept in a
least-recently-used cache bounded over all clients (MAX_SELECTIONS renderings, MAX_SELECTION_BYTES).
Every rendering carries a digest of its plain body, from which the server makes its ETag.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import gzip
import hashlib
import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics

from exporter.framework.catalog import MetricSpec, MetricType
from exporter.framework.snapshot import Series, Snapshot

# Fast compression: the bytes go over loopback or a LAN and are re-made on every change.
GZIP_LEVEL = 1
# A format scraped within this many seconds is rendered ahead of the next scrape.
WANTED_SECONDS = 600.0
# The selection cache's bounds, over every client: renderings (a set of names in one format) and their
# bytes (plain + gzip). A launcher asks for one or two sets per node; these leave room for a few dozen
# more (curl, dashboards) before the least recently used is dropped. The newest rendering is always kept
# (it is never larger than the whole /metrics), so the bytes are at most max(the cap, one whole body).
MAX_SELECTIONS = 64
MAX_SELECTION_BYTES = 8 * 2**20
# Hex digits of the body's SHA-256 kept in the ETag: 128 bits (SHA-256 is the cheapest hash here, ~5% of
# the gzip it sits beside).
DIGEST_HEX = 32


class Format(enum.Enum):
    TEXT = "text/plain; version=0.0.4; charset=utf-8"
    OPENMETRICS = openmetrics.CONTENT_TYPE_LATEST

    @property
    def content_type(self) -> str:
        return self.value


def metric_family(spec: MetricSpec, series: Iterable[tuple[tuple[str, ...], float]]) -> Metric:
    family: Metric
    if spec.type is MetricType.COUNTER:
        family = CounterMetricFamily(spec.base_name, spec.help, labels=spec.labels, unit=spec.unit)
    elif spec.type is MetricType.INFO:
        family = InfoMetricFamily(spec.base_name, spec.help, labels=spec.labels)
        for label_values, _ in series:
            family.add_metric(label_values, {})
        return family
    else:
        family = GaugeMetricFamily(spec.base_name, spec.help, labels=spec.labels, unit=spec.unit)
    for label_values, value in series:
        family.add_metric(label_values, value)
    return family


def build_families(snapshots: Iterable[Snapshot]) -> list[Metric]:
    """Every served family, sorted by name, built once and shared by both formats."""
    items = sorted(((spec, series) for snapshot in snapshots for spec, series in snapshot),
                   key=lambda item: item[0].name)
    return [metric_family(spec, series) for spec, series in items]


class _Families:
    """The prometheus_client "collector" interface over already-built families."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


_OPENMETRICS_EOF = b"# EOF\n"
# prometheus_client >= 0.22 escapes every sample's name character by character (its default, "underscores",
# maps characters outside the legacy set to _), which is most of an OpenMetrics encoding's CPU. Every name
# in the catalog is in the legacy set (exporter/framework/catalog.py checks), where "allow-utf-8" gives the same bytes
# with a str.replace: a quarter of the CPU (tests/test_footprint.py holds the bytes equal).
_OPENMETRICS_OPTIONS = ({"escaping": openmetrics.ALLOWUTF8}
                        if "escaping" in inspect.signature(openmetrics.generate_latest).parameters else {})


def encode_family(fmt: Format, spec: MetricSpec, series: Series) -> bytes:
    """One family in `fmt`, without OpenMetrics' end marker."""
    families = _Families([metric_family(spec, series)])
    if fmt is Format.OPENMETRICS:
        return openmetrics.generate_latest(families, **_OPENMETRICS_OPTIONS).removesuffix(  # type: ignore[arg-type]
            _OPENMETRICS_EOF)
    return generate_latest(families)  # type: ignore[arg-type]


# A collector's last encoding of each family: the series it was made from and the bytes.
Encoded = dict[MetricSpec, tuple[Series, bytes]]


def family_chunk(fmt: Format, spec: MetricSpec, series: Series, previous: Mapping[MetricSpec, tuple[Series, bytes]]
                 | None) -> bytes:
    """One family's bytes: those in `previous` when they were made from equal series, else encoded now.
    (Comparing with the kept series is cheaper than hashing them: tuples compare item by item, by
    identity first.)"""
    kept = previous.get(spec) if previous else None
    if kept is not None and (kept[0] is series or kept[0] == series):
        return kept[1]
    return encode_family(fmt, spec, series)


def encode(fmt: Format, snapshot: Snapshot, previous: Mapping[MetricSpec, tuple[Series, bytes]] | None = None,
           encoded: Encoded | None = None) -> tuple[bytes, ...]:
    """One snapshot's families in `fmt`, one chunk each, without OpenMetrics' end marker. A family whose
    series are equal to those in `previous` (the same collector's last encoding) reuses its bytes; `encoded`
    gets them all. The chunks are kept as they are (not joined per snapshot): a body is the only copy."""
    chunks = []
    for spec, series in sorted(snapshot, key=lambda item: item[0].name):
        chunk = family_chunk(fmt, spec, series, previous)
        if encoded is not None:
            encoded[spec] = (series, chunk)
        chunks.append(chunk)
    return tuple(chunks)


@dataclass(frozen=True)
class Rendering:
    """A body gzipped (what Prometheus asks for), the chunks it is made of, and a digest of the plain body
    (the ETag's value). The plain body is joined from the chunks when a scrape first asks for it and then
    kept: where every scrape wants gzip, the chunks are the only copy of the text (~300 KB with 8 GPUs)."""

    chunks: tuple[bytes, ...]
    gzipped: bytes
    digest: str

    @functools.cached_property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def size(self) -> int:
        """Bytes held: the chunks (or the body they are joined into) and the gzipped body."""
        return sum(len(chunk) for chunk in self.chunks) + len(self.gzipped)

    def etag(self, gzipped: bool) -> str:
        """The ETag's value for this body, as sent plain or gzipped: a strong validator names one sequence
        of bytes, so the gzipped representation gets its own (Apache's mod_deflate spells it the same way;
        aiohttp's FileResponse does the same for a pre-compressed file)."""
        return f"{self.digest}-gzip" if gzipped else self.digest

    @classmethod
    def of(cls, fmt: Format, chunks: Iterable[bytes], joined: bool = False) -> Rendering:
        """`joined`: keep the plain body as one piece rather than the chunks (a selection's chunks are
        shared with the whole body's; the joined piece is its own, and small)."""
        parts = (*chunks, _OPENMETRICS_EOF) if fmt is Format.OPENMETRICS else tuple(chunks)
        plain = b"".join(parts)
        digest = hashlib.sha256(plain).hexdigest()[:DIGEST_HEX]
        return cls((plain,) if joined else parts, gzip.compress(plain, GZIP_LEVEL, mtime=0), digest)


class ChunkCache:
    """Encoded chunks of the snapshots being served, by snapshot and format."""

    def __init__(self) -> None:
        # (id(snapshot), format) -> (snapshot, its chunks); holding the snapshot keeps its id unique.
        self._chunks: dict[tuple[int, Format], tuple[Snapshot, tuple[bytes, ...]]] = {}
        # (collector, format) -> its last encoding by family: most families (a GPU's inventory, limits, link
        # states; 75% of the GPU series) are equal from one run to the next and keep their bytes. At most one
        # entry per family of the catalog.
        self._families: dict[tuple[str, Format], Encoded] = {}
        self._lock = threading.Lock()

    def render(self, snapshots: Sequence[Snapshot], formats: Iterable[Format]) -> dict[Format, Rendering]:
        with self._lock:
            served = {id(snapshot) for snapshot in snapshots}
            live = {key: entry for key, entry in self._chunks.items() if key[0] in served}
            renderings = {}
            for fmt in formats:
                chunks = []
                for snapshot in snapshots:
                    entry = live.get((id(snapshot), fmt))
                    if entry is None:
                        encoded: Encoded = {}
                        chunk = encode(fmt, snapshot, self._families.get((snapshot.collector, fmt)), encoded)
                        self._families[(snapshot.collector, fmt)] = encoded
                        entry = live[(id(snapshot), fmt)] = (snapshot, chunk)
                    chunks.extend(entry[1])
                renderings[fmt] = Rendering.of(fmt, chunks)
            self._chunks = live
            return renderings

    def select(self, snapshots: Sequence[Snapshot], fmt: Format, names: frozenset[str]) -> Rendering:
        """The body `render` would make, with only the families named: the same chunks in the same order
        (snapshots as served, families by name within each), encoding only the named families that the
        last encoding of their collector does not already hold."""
        with self._lock:
            chunks = []
            for snapshot in snapshots:
                chosen = sorted(((spec, series) for spec, series in snapshot if spec.name in names),
                                key=lambda item: item[0].name)
                if not chosen:
                    continue
                table = self._families.setdefault((snapshot.collector, fmt), {})
                for spec, series in chosen:
                    chunk = family_chunk(fmt, spec, series, table)
                    table[spec] = (series, chunk)
                    chunks.append(chunk)
            return Rendering.of(fmt, chunks, joined=True)


class Publisher:
    """Keeps the served bytes equal to the rendering of the scheduler's fresh snapshots."""

    def __init__(self, snapshots: Callable[[float], list[Snapshot]], next_expiry: Callable[[float], float | None],
                 debounce_seconds: float = 0.05, max_selections: int = MAX_SELECTIONS,
                 max_selection_bytes: int = MAX_SELECTION_BYTES) -> None:
        self._snapshots = snapshots
        self._next_expiry = next_expiry
        self._debounce = debounce_seconds
        self._changed = asyncio.Event()
        self._chunks = ChunkCache()
        self._renderings: dict[Format, Rendering] = {}
        self._cold: dict[Format, asyncio.Future[dict[Format, Rendering]]] = {}  # first renderings in flight
        self._wanted_at: dict[Format, float] = {}
        # Selections of the served snapshots, least recently used first; emptied when they are replaced.
        self._selections: OrderedDict[tuple[frozenset[str], Format], Rendering] = OrderedDict()
        self._selection_bytes = 0
        self._max_selections = max_selections
        self._max_selection_bytes = max_selection_bytes
        # Selections being rendered, by set, format and the rendering they select from: a burst of the same
        # request waits on one (bounded by the scrapes served at once, exporter/serving/guard.py).
        self._selecting: dict[tuple[frozenset[str], Format, int], asyncio.Future[Rendering]] = {}
        self.renders = 0  # renderings of the served snapshots so far: which ones a selection was made from
        self.selections_rendered = 0
        # What the served bytes were rendered from; other consumers (OTLP push) read the same.
        self.latest_snapshots: list[Snapshot] = []

    def notify(self) -> None:
        self._changed.set()

    async def rendering(self, fmt: Format) -> Rendering:
        """The whole body in `fmt`."""
        loop = asyncio.get_running_loop()
        self._wanted_at[fmt] = loop.time()  # from now on every rendering includes it
        rendering = self._renderings.get(fmt)
        if rendering is None:  # not scraped lately: assemble it once from the served snapshots, then keep it
            rendering = await self._render_cold(fmt)
        return rendering

    async def selection(self, fmt: Format, names: frozenset[str]) -> Rendering:
        """The body in `fmt` with only the families in `names` (exact names; unknown ones are absent). Made
        once per set and change of the served snapshots, off the loop, and kept while the cache holds it;
        asking for it does not make `fmt` rendered ahead (a launcher's few families must not cost the whole
        body on every change)."""
        key = (names, fmt)
        kept = self._selections.get(key)
        if kept is not None:
            self._selections.move_to_end(key)
            return kept
        generation, snapshots = self.renders, self.latest_snapshots
        flight = (names, fmt, generation)
        pending = self._selecting.get(flight)
        if pending is None:
            pending = self._selecting[flight] = asyncio.ensure_future(
                asyncio.to_thread(self._chunks.select, snapshots, fmt, names))
            pending.add_done_callback(lambda _: self._selecting.pop(flight, None))
            self.selections_rendered += 1
        rendering = await asyncio.shield(pending)
        if self.renders == generation:  # not replaced meanwhile (then it was the answer when asked, not now)
            self._keep(key, rendering)
        return rendering

    def _keep(self, key: tuple[frozenset[str], Format], rendering: Rendering) -> None:
        replaced = self._selections.pop(key, None)
        if replaced is not None:
            self._selection_bytes -= replaced.size
        self._selections[key] = rendering
        self._selection_bytes += rendering.size
        while len(self._selections) > 1 and (len(self._selections) > self._max_selections
                                             or self._selection_bytes > self._max_selection_bytes):
            _, dropped = self._selections.popitem(last=False)
            self._selection_bytes -= dropped.size

    def selection_cache(self) -> tuple[int, int]:
        """(renderings, bytes) the selection cache holds."""
        return len(self._selections), self._selection_bytes

    async def _render_cold(self, fmt: Format) -> Rendering:
        """One rendering of `fmt` off the loop, shared by the scrapes that ask while it runs."""
        snapshots = self.latest_snapshots
        pending = self._cold.get(fmt)
        if pending is None:
            pending = self._cold[fmt] = asyncio.ensure_future(asyncio.to_thread(self._chunks.render, snapshots, [fmt]))
            pending.add_done_callback(lambda _: self._cold.pop(fmt, None))
        rendering = (await asyncio.shield(pending))[fmt]
        if fmt not in self._renderings and self.latest_snapshots is snapshots:  # not replaced meanwhile
            self._renderings[fmt] = rendering
        return rendering

    async def render_now(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        wanted = [fmt for fmt, at in self._wanted_at.items() if now - at < WANTED_SECONDS]
        snapshots = self._snapshots(now)
        renderings = await asyncio.to_thread(self._chunks.render, snapshots, wanted)
        self._renderings, self.latest_snapshots = renderings, snapshots  # swapped together, on the loop
        self.renders += 1
        # Selections of the snapshots replaced can no longer be served: their bytes go now, not when evicted.
        self._selections.clear()
        self._selection_bytes = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expiry = self._next_expiry(loop.time())
            timeout = None if expiry is None else max(0.0, expiry - loop.time()) + 0.001
            try:
                async with asyncio.timeout(timeout):
                    await self._changed.wait()
            except TimeoutError:
                pass  # a snapshot went stale: render without it
            # Coalesce collectors that finish together into one rendering.
            await asyncio.sleep(self._debounce)
            self._changed.clear()
            await self.render_now()
