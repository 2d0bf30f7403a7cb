"""What the cluster's exporters serve now: one read of every node's /metrics, kept to the families the
watcher looks at. The watcher asks nothing of Ray: the exporters already collect all of it.

Where the exporters are: a local cluster's record lists them; on an existing cluster the head
exporter's /sd lists every node's (as it does for Prometheus). Exporters under a web config (TLS,
basic auth) are read through the ExporterAccess the launcher keeps for them (state.ExporterAccess).

Every read of an exporter (here, and the recorder's) goes through one bounded reader, `get`: an
exporter is foreign input and may be dying, slow or hostile, so a read has one deadline for the whole
request (a server trickling a byte at a time cannot hold it), caps on the bytes on the wire and on
what they inflate to (a gzip bomb), and every way it can go wrong ends as one ReadError. A target
reached another way (a KubeRay pod's sidecar through the API server's proxy, launcher/backends/kuberay/proxy.py)
carries its own Reader, which reads the body through the same bounds (`read_body`, `answer_of`).
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import itertools
import json
import re
import socket
import ssl
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from exporter.contract import wire
from exporter.contract.digest import FAMILIES, NodeDigest, build
from launcher import exposition
from launcher.state import ExporterAccess

READ_TIMEOUT_S = 3.0
# Reads in flight at once, for the whole launcher (the watcher and the recorder share one pool): a
# loopback read takes ~1 ms of this process's CPU, so 32 keeps 2,000 reads within a second or two of
# wall while bounding sockets and threads however many nodes /sd lists.
MAX_PARALLEL = 32
# A node's /metrics is a few MB at most (a full progress store, 10k series, is about 1.5 MB): caps
# with room to spare that still keep a hostile answer from costing the launcher much memory per read.
MAX_WIRE_BYTES = 8 * 2**20
MAX_INFLATED_BYTES = 32 * 2**20
CHUNK_BYTES = 64 * 1024
INFLATE_PIECE_BYTES = 2**20
MAX_ETAG_CHARS = 200  # an exporter's ETag is a digest; a longer one is not kept (it is sent back)
MAX_REASON_CHARS = 80  # of a status line's reason phrase, which ends up in the journal
# The watcher reads the families a node's digest is made of (FAMILIES); every other line of /metrics
# is skipped before parsing.
_WATCHED = exposition.keeping(FAMILIES)
# A sample name's family, for reading changed lines alone: the catalog's, the same on every exporter.
_FAMILY_OF: dict[str, exposition.Family] = {}
# What the watcher asks for: only its families, pre-rendered by the exporter (an exporter too old to
# know `name[]` sends everything, which parse() cuts down as before).
FAMILIES_PATH = wire.metrics_path(FAMILIES)


class ReadError(OSError):
    """A read of an exporter that gave no usable answer; the message says why, for a person. An
    OSError, so callers that treat an unreachable exporter as one go on treating a broken one so."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


class Reader(Protocol):
    """A GET of one path of a target's exporter (`/metrics?...`) by another transport than plain HTTP(S),
    bounded as get_if_changed() is; raises ReadError, and only that."""

    def __call__(self, path: str, timeout: float, etag: str | None = None) -> Answer: ...


@dataclass(frozen=True)
class Target:
    node: str  # the launcher's or /sd's name for the node
    url: str  # the exporter's base URL (with a reader: where it reads, for the journal and as a key)
    access: ExporterAccess | None = None  # TLS trust and credentials, when the exporter has a web config
    reader: Reader | None = None  # None: plain HTTP(S) to `url`
    pod: str | None = None  # the pod the exporter serves from, when it is a KubeRay sidecar

    def get(self, path: str, timeout: float, etag: str | None = None) -> Answer:
        """A bounded, conditional, gzip-accepting read of `path`, by the target's transport."""
        if self.reader is not None:
            return self.reader(path, timeout, etag)
        return get_if_changed(self.url.rstrip("/") + path, self.access, timeout, etag, accept_gzip=True)


@dataclass
class NodeRead:
    """One exporter's answer (or why there was none): its digest, which faults are judged from, made
    here from the samples of a direct read, or as the head's fleet document gave it."""

    target: Target
    samples: list[Sample] = field(default_factory=list)  # a direct read's (none from the fleet document)
    error: str | None = None
    not_modified: bool = False  # a 304 (or an entry unchanged in the fleet document): as last time
    digest: NodeDigest | None = None
    answered_before: bool = False  # the head says it answered once (an exporter never read may be starting)

    def __post_init__(self) -> None:
        if self.digest is None and self.error is None:
            self.digest = build((sample.name, sample.labels, sample.value) for sample in self.samples)

    @property
    def ok(self) -> bool:
        return self.error is None

    def select(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    @property
    def ray_node_ids(self) -> set[str]:
        """The Ray nodes this exporter watches."""
        return set(self.digest.ray_node_ids) if self.digest is not None else set()


def parse(text: str) -> list[Sample]:
    """The watched families' samples of an exposition (other families skipped unparsed)."""
    return _samples(text, None)[0]


def _samples(text: str, last: Last | None) -> tuple[list[Sample], array]:
    """The watched samples of an answer and a hash of each line, parsing only the lines that changed since
    the target's answer `last` (launcher/exposition.py)."""
    answer = exposition.read(text, _WATCHED, last.keys if last is not None else None, _FAMILY_OF)
    before = last.samples if last is not None else []
    return [before[item] if isinstance(item, int) else Sample(item.name, item.labels, item.value)
            for item in answer.items], answer.keys


# --- the bounded reader ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A conditional read's answer: the body (None for a 304: the same as the ETag named) and its ETag."""

    body: bytes | None
    etag: str | None


def get(url: str, access: ExporterAccess | None, timeout: float = READ_TIMEOUT_S, *, accept_gzip: bool = False,
        max_wire_bytes: int = MAX_WIRE_BYTES, max_inflated_bytes: int = MAX_INFLATED_BYTES) -> bytes:
    """The body of a GET of `url` (inflated when it came gzipped), within `timeout` seconds for the
    whole request: connecting, TLS, the headers and the body. Raises ReadError, and only that.
    Redirects are not followed (an exporter never sends one; credentials never go elsewhere)."""
    body = get_if_changed(url, access, timeout, accept_gzip=accept_gzip, max_wire_bytes=max_wire_bytes,
                          max_inflated_bytes=max_inflated_bytes).body
    assert body is not None  # no ETag named: never a 304
    return body


def get_if_changed(url: str, access: ExporterAccess | None, timeout: float = READ_TIMEOUT_S, etag: str | None = None,
                   *, accept_gzip: bool = False, max_wire_bytes: int = MAX_WIRE_BYTES,
                   max_inflated_bytes: int = MAX_INFLATED_BYTES) -> Answer:
    """As get(), with If-None-Match: `etag` (as the last answer gave it, quotes and all) when given;
    a 304 is an Answer without a body. Raises ReadError, and only that."""
    deadline = time.monotonic() + timeout
    try:
        status, body, encoding, tag = _fetch(url, access, deadline, timeout, accept_gzip, max_wire_bytes, etag)
        if status == 304:
            return Answer(None, tag or etag)
        return Answer(_inflate(body, max_inflated_bytes) if encoding == "gzip" else body, tag)
    except ReadError:
        raise
    except Exception as exc:  # noqa: BLE001 - foreign input: whatever an answer makes a read raise is its error
        raise ReadError(_why(exc)) from None


def _fetch(url: str, access: ExporterAccess | None, deadline: float, timeout: float, accept_gzip: bool,
           max_wire_bytes: int, etag: str | None = None) -> tuple[int, bytes, str, str | None]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ReadError(f"not an http(s) URL: {url!r}")
    if parts.scheme == "https":
        context = (access.ssl_context() if access else None) or ssl.create_default_context()
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=timeout, context=context)
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    headers = {"Accept-Encoding": "gzip" if accept_gzip else "identity", "Connection": "close"}
    if etag:
        headers["If-None-Match"] = etag
    authorization = access.authorization() if access else None
    if authorization:
        headers["Authorization"] = authorization
    # Socket timeouts bound each recv, not the request: at the deadline the socket is shut down, which
    # wakes a recv blocked in the headers or the body (close() alone would not).
    expired = threading.Event()
    watch = _REAPER.watch(deadline, connection, expired)
    try:
        connection.connect()
        if expired.is_set():  # the deadline passed while connecting, before there was a socket to cut
            raise ReadError(f"no whole answer within {timeout:g}s")
        connection.sock.settimeout(max(0.001, deadline - time.monotonic()))  # no single wait past the deadline
        connection.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=headers)
        response = connection.getresponse()
        tag = etag_of(response.getheader("ETag"))
        if response.status == 304 and etag:
            return 304, b"", "identity", tag
        if response.status != 200:
            raise ReadError(f"HTTP {response.status} {_printable(response.reason)}".rstrip())
        body = read_body(response.read1, lambda: response.length, response.getheader("Content-Length"), expired,
                         deadline, timeout, max_wire_bytes)
        return 200, body, _encoding(response.getheader("Content-Encoding")), tag
    except Exception as exc:
        # What the shutdown made of a read in flight, or a socket timeout (set to the time left) that came first
        if expired.is_set() or isinstance(exc, TimeoutError):
            raise ReadError(f"no whole answer within {timeout:g}s") from None
        raise
    finally:
        _REAPER.forget(watch)
        connection.close()


def etag_of(header: str | None) -> str | None:
    """An answer's ETag as it is kept and sent back: printable and short, else none."""
    return header.strip() if header and len(header) <= MAX_ETAG_CHARS and header.isprintable() else None


def read_body(read1: Callable[[int], bytes], left: Callable[[], int | None], length: str | None,
              expired: threading.Event, deadline: float, timeout: float, max_wire_bytes: int) -> bytes:
    """A 200's body, a chunk at a time: never more than `max_wire_bytes`, never past the deadline (`expired`
    is set when the reaper cut the socket). `left` is what Content-Length says is still to come."""
    if length is not None and length.strip().isdigit() and int(length) > max_wire_bytes:
        raise ReadError(f"an answer of {int(length)} bytes, more than the {max_wire_bytes} read")
    chunks, size = [], 0
    while True:
        chunk = read1(CHUNK_BYTES)
        if expired.is_set() or time.monotonic() > deadline:
            raise ReadError(f"no whole answer within {timeout:g}s")
        if not chunk:
            if left():  # read1 takes an early close for the end; Content-Length says otherwise
                raise http.client.IncompleteRead(b"".join(chunks), left())
            break
        size += len(chunk)
        if size > max_wire_bytes:
            raise ReadError(f"an answer of more than {max_wire_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _encoding(header: str | None) -> str:
    encoding = (header or "identity").strip().lower()
    if encoding not in ("gzip", "identity"):
        raise ReadError(f"an answer in an encoding not asked for ({_printable(encoding)})")
    return encoding


def answer_of(body: bytes, encoding_header: str | None, etag: str | None,
              max_inflated_bytes: int = MAX_INFLATED_BYTES) -> Answer:
    """A 200's body as the watcher takes it: inflated (never past the cap) when it came gzipped."""
    encoding = _encoding(encoding_header)
    return Answer(_inflate(body, max_inflated_bytes) if encoding == "gzip" else body, etag)


def why(exc: BaseException) -> ReadError:
    """Whatever a read raised, as the one error a read ends with."""
    return exc if isinstance(exc, ReadError) else ReadError(_why(exc))


def cut_at(deadline: float, connection: http.client.HTTPConnection, expired: threading.Event) -> list[Any]:
    """Have the reads' one reaper shut `connection`'s socket down at `deadline` (forget_cut() when done)."""
    return _REAPER.watch(deadline, connection, expired)


def forget_cut(entry: list[Any]) -> None:
    _REAPER.forget(entry)


class _Reaper:
    """One thread that cuts every read still open at its deadline (a timer thread per read would cost a
    thread start per node per check). Reads are kept in a heap by deadline; one that ended is forgotten
    (marked, and dropped when its deadline comes up)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, list[Any]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, deadline: float, connection: http.client.HTTPConnection, expired: threading.Event) -> list[Any]:
        entry: list[Any] = [connection, expired]
        with self._wake:
            heapq.heappush(self._heap, (deadline, next(self._order), entry))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="read-deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is entry:
                self._wake.notify()  # an earlier deadline than the one waited for
        return entry

    def forget(self, entry: list[Any]) -> None:
        with self._wake:
            entry.clear()  # done: nothing to cut (the heap drops it at its deadline)

    def _run(self) -> None:
        with self._wake:
            while True:
                while self._heap and not self._heap[0][2]:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._wake.wait()
                    continue
                deadline, _, entry = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                heapq.heappop(self._heap)
                if entry:
                    _cut(*entry)


_REAPER = _Reaper()


def _cut(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    expired.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed
            sock.shutdown(socket.SHUT_RDWR)


def _inflate(body: bytes, limit: int) -> bytes:
    """gzip (one member or several) inflated, never to more than `limit` bytes: inflated a piece at a
    time, so a bomb costs at most `limit` bytes before it is refused (zlib's own growing buffer for a
    whole answer would double that)."""
    pieces, size, data = [], 0, body
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    while True:
        piece = decoder.decompress(data, INFLATE_PIECE_BYTES)
        size += len(piece)
        if size > limit:
            raise ReadError(f"a gzip answer that inflates past {limit} bytes")
        if piece:
            pieces.append(piece)
        if decoder.eof:
            data = decoder.unused_data
            if not data:
                break
            decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the next member
            continue
        data = decoder.unconsumed_tail
        if not data and not piece:
            raise ReadError("a gzip answer cut short")
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _printable(text: str) -> str:
    """Foreign text bound for the journal: printable ASCII, short."""
    return re.sub(r"[^\x20-\x7e]", "?", text or "")[:MAX_REASON_CHARS]


def _why(exc: BaseException) -> str:
    """A read's failure in words, for a person (and the journal: printable, short)."""
    if isinstance(exc, http.client.IncompleteRead):
        more = f", {exc.expected} more expected" if isinstance(exc.expected, int) else ""
        return f"an answer cut short ({len(exc.partial)} bytes read{more})"
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, UnicodeError):
        return "an answer that is not UTF-8"
    if isinstance(exc, zlib.error):
        return f"a gzip answer that does not inflate ({_printable(str(exc))})"
    text = _printable(str(getattr(exc, "reason", None) or exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def fetch_metrics(url: str, access: ExporterAccess | None, timeout: float = READ_TIMEOUT_S) -> str:
    """An exporter's /metrics text (`url` is its base URL), gzip on the wire, through `access` when
    it has a web config. Raises ReadError (an OSError) when there is no usable answer."""
    body = get(url.rstrip("/") + wire.METRICS_PATH, access, timeout, accept_gzip=True)
    return body.decode(errors="replace")


def fetch_sd(sd_url: str, access: ExporterAccess | None, timeout: float = READ_TIMEOUT_S) -> list[dict[str, Any]]:
    """The target groups the head exporter's /sd lists, each as {"targets": [str], "labels": {str: str}};
    groups of any other shape are left out. Raises ReadError (an OSError) when there is no usable answer."""
    try:
        answer = json.loads(get(sd_url, access, timeout).decode())
    except (ValueError, RecursionError) as exc:  # not UTF-8 or not JSON (or nested past the parser)
        raise ReadError(f"an /sd answer that is not JSON ({type(exc).__name__})") from None
    if not isinstance(answer, list):
        raise ReadError("an /sd answer that is not a list of target groups")
    groups = []
    for group in answer:
        if not isinstance(group, dict):
            continue
        targets, labels = group.get("targets") or [], group.get("labels") or {}
        if not isinstance(targets, list) or not isinstance(labels, dict):
            continue
        groups.append({"targets": [t for t in targets if isinstance(t, str) and t],
                       "labels": {str(k): str(v) for k, v in labels.items() if isinstance(v, str | int | float)}})
    return groups


def read(target: Target, timeout: float = READ_TIMEOUT_S, known: Known | None = None) -> NodeRead:
    """One exporter's answer, or why there is none; never raises (an exporter is foreign input). With
    `known` (what this target answered last, kept by the caller) it asks only for the watched families,
    If-None-Match their ETag: an unchanged node answers 304 and costs no parse."""
    if known is None:
        try:
            answer = target.get(wire.METRICS_PATH, timeout)
            assert answer.body is not None  # no ETag named: never a 304
            text = answer.body.decode(errors="replace")
        except ReadError as exc:
            return NodeRead(target, error=str(exc))
        try:
            return NodeRead(target, parse(text))
        except Exception as exc:  # noqa: BLE001 - prometheus_client's parser raises more than ValueError on garbage
            return NodeRead(target, error=f"an exposition that does not parse ({_why(exc)})")
    last = known.get(target.url)
    try:
        answer = target.get(FAMILIES_PATH, timeout, last.etag if last else None)
    except ReadError as exc:
        known.pop(target.url, None)
        return NodeRead(target, error=str(exc))
    if answer.body is None and last is not None:
        return NodeRead(target, last.samples, not_modified=True, digest=last.digest)
    try:
        samples, keys = _samples(answer.body.decode(errors="replace") if answer.body is not None else "", last)
    except Exception as exc:  # noqa: BLE001 - as above
        known.pop(target.url, None)
        return NodeRead(target, error=f"an exposition that does not parse ({_why(exc)})")
    node = NodeRead(target, samples)
    known[target.url] = Last(answer.etag, samples, keys, node.digest)  # no ETag: no 304s, but changed lines only
    return node


@dataclass
class Last:
    """What a target answered last: its ETag (None: the exporter sends none), samples, and lines parsed."""

    etag: str | None
    samples: list[Sample]
    keys: array  # a hash of each sample line, in order
    digest: NodeDigest | None = None


Known = dict[str, Last]  # by target URL
_POOL = ThreadPoolExecutor(max_workers=MAX_PARALLEL, thread_name_prefix="exporter-read")


def pool() -> ThreadPoolExecutor:
    """The launcher's one pool of exporter reads (the watcher's and the recorder's): MAX_PARALLEL at once."""
    return _POOL


def read_all(targets: Iterable[Target], known: Known | None = None, timeout: float = READ_TIMEOUT_S) -> list[NodeRead]:
    """Every exporter, MAX_PARALLEL at a time, within one deadline `timeout` from now for all of them: a
    slow one costs at most that, and a read still queued at the deadline is an error, not a late read."""
    targets = list(targets)
    deadline = time.monotonic() + timeout

    def one(target: Target) -> NodeRead:
        left = deadline - time.monotonic()
        if left <= 0:
            return NodeRead(target, error=f"not read within the check's {timeout:g}s")
        return read(target, left, known)

    return list(_POOL.map(one, targets))


def sd_targets(sd_url: str, timeout: float = READ_TIMEOUT_S, access: ExporterAccess | None = None) -> list[Target]:
    """Every node's exporter as the head exporter's /sd lists them (with `access`: all read through it)."""
    scheme = access.scheme if access else "http"
    found = []
    for group in fetch_sd(sd_url, access, timeout):
        labels = group["labels"]
        for address in group["targets"]:
            found.append(Target(node=str(labels.get("node") or address), url=f"{scheme}://{address}", access=access))
    return found


TargetSource = Callable[[], list[Target]]


def from_sd(sd_url: str, access: ExporterAccess | None = None) -> TargetSource:
    """A target source that re-reads /sd at every check (nodes come and go); an unreachable /sd
    gives no targets, which the watcher reports."""

    def targets() -> list[Target]:
        try:
            return sd_targets(sd_url, access=access)
        except OSError:  # ReadError among them
            return []

    return targets
