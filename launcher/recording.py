"""A run's metrics, kept with the run: while it lives, a Recorder scrapes every exporter the head
exporter's /sd lists, keeps the families a report needs (ALLOWED_PREFIXES, ALLOWED_FAMILIES) and
appends them to `<run dir>/metrics.jsonl.gz`, so the run can be looked at (`launcher report`) or
backfilled into a Prometheus (`launcher export`) after its cluster is gone.

The file is JSON lines in gzip, one gzip member per scrape round (concatenated members are one
valid gzip file): a crash can cut only the last member short, and `read()` keeps every round
before it. Lines:

    {"kind": "meta", "version": 1, "started": 1700000000.0, "interval": 15.0, "max_bytes": ..., ...}
    {"kind": "family", "name": "raypulse_gpu_xid_errors", "type": "counter", "help": "..."}
    {"kind": "series", "id": 7, "family": "raypulse_gpu_xid_errors", "name": "raypulse_gpu_xid_errors_total",
     "labels": {"gpu": "0", "uuid": "GPU-...", "xid": "79", "cluster": ..., "node": ..., "job": ..., "instance": ...}}
    {"kind": "scrape", "t": 1700000015.0, "s": [[7, 1.0], [8, 0.93], ...]}
    {"kind": "end", "t": ..., "reason": "stopped" | "size cap of 256 MiB reached" | "disk nearly full: ..."}

A series is named once and then referred to by id. Every target also gets Prometheus's synthetic
`up` series (1 read, 0 not), with the target labels Prometheus would give it (those of /sd plus
`job` and `instance`), so a backfilled recording selects like live data.

Bounded: the recorder stops (and says so, in the file and to `notify`) before the file passes
`max_bytes`, or when the disk under the run dir has less than `min_free_bytes` left.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from alerts.config import DEFAULT as ALERTS_CONFIG
from exporter import wire
from launcher.health.exporters import fetch_metrics, fetch_sd
from launcher.state import FILE_MODE, ExporterAccess, private_dir

FILE_NAME = "metrics.jsonl.gz"
FORMAT_VERSION = 1
DEFAULT_INTERVAL_S = 15.0
DEFAULT_MAX_BYTES = 256 * 2**20
DEFAULT_MIN_FREE_BYTES = 1 * 2**30  # never take the disk's last GiB
READ_TIMEOUT_S = 5.0
STOP_WAIT_S = 3 * READ_TIMEOUT_S  # /sd, then the scrapes in parallel
MAX_PARALLEL = 16

# What is kept. Whole domains whose series are the run's own (bounded by the exporter per job and
# rank): training progress per rank, RL iterations and phases, the job's state, attempts and processes,
# and healing.
ALLOWED_PREFIXES = ("raypulse_train_", "raypulse_rl_", "raypulse_job_", "raypulse_run_")
# From the per-node and per-GPU domains, the families a report draws or a fault shows in, and what
# the dashboards join on or select with (the *_info series, the exporter's build info).
ALLOWED_FAMILIES = frozenset({
    # GPUs: identity, health, the four curves of the report, faults, what runs on them
    "raypulse_gpu_info", "raypulse_gpu_up", "raypulse_gpu_utilization_ratio", "raypulse_gpu_memory_used_bytes",
    "raypulse_gpu_memory_total_bytes", "raypulse_gpu_power_usage_watts", "raypulse_gpu_power_limit_watts",
    "raypulse_gpu_temperature_celsius", "raypulse_gpu_xid_errors_total", "raypulse_gpu_xid_last_timestamp_seconds",
    "raypulse_gpu_ecc_errors_total", "raypulse_gpu_lost_events_total", "raypulse_gpu_row_remap_pending",
    "raypulse_gpu_row_remap_failed", "raypulse_gpu_recovery_action",
    "raypulse_gpu_process_info", "raypulse_gpu_process_memory_used_bytes", "raypulse_gpu_processes",
    # nodes: CPU, memory, network
    "raypulse_node_info", "raypulse_node_cpus", "raypulse_node_cpu_seconds_total", "raypulse_node_memory_total_bytes",
    "raypulse_node_memory_available_bytes", "raypulse_node_network_receive_bytes_total",
    "raypulse_node_network_transmit_bytes_total", "raypulse_pod_memory_oom_kills_total",
    # Ray: which nodes live and die, what they offer and use
    "raypulse_ray_up", "raypulse_ray_nodes", "raypulse_ray_node_alive", "raypulse_ray_node_info",
    "raypulse_ray_node_death_reason", "raypulse_ray_node_resource_capacity", "raypulse_ray_node_resource_used",
    # the exporter itself: the dashboards' variables are read from its build info
    "raypulse_exporter_build_info",
})
UP = "up"  # Prometheus's own per-target series, as it would record it


def allowed(name: str) -> bool:
    """Whether a sample name (a counter's with its `_total`) is recorded."""
    return name in ALLOWED_FAMILIES or name.startswith(ALLOWED_PREFIXES)


def path_of(run_dir: Path) -> Path:
    return run_dir / FILE_NAME


# --- scraping ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScrapeTarget:
    address: str  # host:port, as /sd lists it (Prometheus's `instance`)
    labels: Mapping[str, str]  # the target labels: /sd's, then `job` and `instance`


def discover(sd_url: str, access: ExporterAccess | None = None, timeout: float = READ_TIMEOUT_S) -> list[ScrapeTarget]:
    """The raypulse exporters /sd lists, with the target labels Prometheus would give them. Groups
    that carry their own scrape job (node_exporter beside ours) are not ours: skipped."""
    found = []
    for group in fetch_sd(sd_url, access, timeout):
        labels = {str(k): str(v) for k, v in (group.get("labels") or {}).items()}
        if wire.SD_JOB_LABEL in labels:
            continue
        for address in group.get("targets") or []:
            found.append(ScrapeTarget(address, {**labels, wire.SD_JOB_LABEL: ALERTS_CONFIG.scrape_job,
                                                "instance": address}))
    return found


def _kept_lines(text: str) -> str:
    """The exposition cut down to allowed families (their HELP, TYPE and samples) before parsing:
    parsing is the recorder's main cost and most of a node's families are not kept."""
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and allowed(parts[2]):
                kept.append(line)
        else:
            end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
            if end > 0 and allowed(line[:end]):
                kept.append(line)
    return "\n".join(kept) + "\n"


@dataclass
class Sample:
    family: str
    type: str
    help: str
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str, target_labels: Mapping[str, str]) -> list[Sample]:
    """The allowed samples of one exposition, with the target's labels added as Prometheus adds
    them (an exposed label that a target label also names becomes `exported_<name>`)."""
    samples = []
    for family in text_string_to_metric_families(_kept_lines(text)):
        for sample in family.samples:
            if sample.name.endswith("_created") or not allowed(sample.name):
                continue  # a counter's creation time: not a series of ours
            labels = {(f"exported_{k}" if k in target_labels else k): v for k, v in sample.labels.items()}
            samples.append(Sample(family.name, family.type, family.documentation, sample.name,
                                  {**labels, **target_labels}, float(sample.value)))
    return samples


def scrape(target: ScrapeTarget, access: ExporterAccess | None, timeout: float = READ_TIMEOUT_S) -> str:
    scheme = access.scheme if access else "http"
    return fetch_metrics(f"{scheme}://{target.address}", access, timeout)


# --- writing -------------------------------------------------------------------------------------


Notify = Callable[[str, Mapping[str, Any]], None]
# Where /sd is: a URL, or a callable that gives it once known (a local cluster starts its exporters
# after the job runs) and None until then.
SdSource = str | Callable[[], str | None]


class Recorder:
    """Records one run while it lives. `start()` and `stop()` may be called from any thread;
    `stop()` is idempotent and returns once the file is closed."""

    def __init__(self, run_dir: Path, sd_url: SdSource, *, interval: float = DEFAULT_INTERVAL_S,
                 max_bytes: int = DEFAULT_MAX_BYTES, min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
                 access: ExporterAccess | None = None, notify: Notify | None = None,
                 meta: Mapping[str, Any] | None = None) -> None:
        if interval <= 0:
            raise ValueError(f"record interval must be positive, not {interval}")
        self.path = path_of(run_dir)
        self.sd_url = sd_url
        self.interval = interval
        self.max_bytes = max_bytes
        self.min_free_bytes = min_free_bytes
        self.access = access
        self.notify = notify
        self.meta = dict(meta or {})
        self.rounds = 0
        self.samples = 0
        self.ended: str | None = None  # why it stopped, once it has
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self._families: set[str] = set()
        self._targets: list[ScrapeTarget] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the file and `ended`
        self._round = threading.Lock()  # one round at a time (the loop's, or a caller's record_once)
        self._pool = ThreadPoolExecutor(max_workers=MAX_PARALLEL, thread_name_prefix="recorder-scrape")
        self._size = 0

    # -- life --

    def start(self) -> Recorder:
        private_dir(self.path.parent)
        with contextlib.suppress(FileNotFoundError):
            self._size = self.path.stat().st_size  # the same run followed again: appended to
        if not self._append([{"kind": "meta", "version": FORMAT_VERSION, "started": time.time(),
                               "interval": self.interval, "max_bytes": self.max_bytes,
                               **self.meta}]):
            return self  # refused by a bound: `ended` says why, and notify was told
        self._say("recording.started", path=str(self.path), interval=self.interval, max_bytes=self.max_bytes)
        self._thread = threading.Thread(target=self._loop, name="recorder", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT_S)  # a round in flight ends within its read timeouts
        self._end("stopped")
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _say(self, kind: str, **details: Any) -> None:
        if self.notify is not None:
            with contextlib.suppress(Exception):  # a report of the recorder never breaks the run
                self.notify(kind, details)

    # -- the loop --

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.record_once()
            except Exception as exc:  # noqa: BLE001 - the recorder never takes the run down
                self._end(f"recorder failed: {type(exc).__name__}: {exc}")
            if self.ended:
                return
            next_at = max(next_at + self.interval, time.monotonic())  # a slow round is not caught up on
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def record_once(self) -> None:
        """One round: discover, scrape every target, append what is kept."""
        with self._round:
            self._record_round()

    def _record_round(self) -> None:
        if self.ended:
            return
        sd_url = self.sd_url() if callable(self.sd_url) else self.sd_url
        if sd_url:
            with contextlib.suppress(OSError, ValueError):  # /sd gone for a while: the targets known last
                self._targets = discover(sd_url, self.access)
        if not self._targets:
            return  # no exporter known yet: nothing to write
        at = time.time()
        reads = list(self._pool.map(self._read, self._targets))
        lines: list[dict[str, Any]] = []
        values: list[list[float]] = []
        for target, samples in zip(self._targets, reads, strict=True):
            up = Sample(UP, "gauge", "1 if the target answered its scrape, else 0 (as Prometheus records it)", UP,
                        dict(target.labels), 0.0 if samples is None else 1.0)
            for sample in [up, *(samples or [])]:
                values.append([self._series_id(sample, lines), sample.value])
        lines.append({"kind": "scrape", "t": round(at, 3), "s": values})
        if self._append(lines):
            self.rounds += 1
            self.samples += len(values)

    def _read(self, target: ScrapeTarget) -> list[Sample] | None:
        try:
            return parse(scrape(target, self.access), target.labels)
        except (OSError, ValueError, EOFError):  # gone, refused, timed out, a broken body: up=0
            return None

    def _series_id(self, sample: Sample, lines: list[dict[str, Any]]) -> int:
        key = (sample.name, tuple(sorted(sample.labels.items())))
        found = self._series.get(key)
        if found is not None:
            return found
        if sample.family not in self._families:
            self._families.add(sample.family)
            lines.append({"kind": "family", "name": sample.family, "type": sample.type, "help": sample.help})
        found = self._series[key] = len(self._series)
        lines.append({"kind": "series", "id": found, "family": sample.family, "name": sample.name,
                      "labels": sample.labels})
        return found

    # -- the file --

    def _append(self, lines: list[dict[str, Any]]) -> bool:
        """One gzip member, written whole or not at all (a round that would pass a bound is not)."""
        member = gzip.compress("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode(),
                               compresslevel=6, mtime=0)
        with self._lock:
            if self.ended:
                return False
            why = self._bound_passed(len(member))
            if why is not None:
                self._end_locked(why)
                return False
            _append_private(self.path, member)
            self._size += len(member)
            return True

    def _bound_passed(self, adding: int) -> str | None:
        end_room = 256  # the end line must still fit
        if self._size + adding + end_room > self.max_bytes:
            return f"size cap of {_human(self.max_bytes)} reached"
        free = shutil.disk_usage(self.path.parent).free
        if free - adding < self.min_free_bytes:
            return (f"disk nearly full: {_human(free)} free under {self.path.parent}, "
                    f"keeping {_human(self.min_free_bytes)}")
        return None

    def _end(self, reason: str) -> None:
        with self._lock:
            self._end_locked(reason)

    def _end_locked(self, reason: str) -> None:
        if self.ended:
            return
        self.ended = reason
        self._stop.set()
        line = {"kind": "end", "t": round(time.time(), 3), "reason": reason, "rounds": self.rounds}
        member = gzip.compress((json.dumps(line) + "\n").encode(), mtime=0)
        with contextlib.suppress(OSError):  # a full disk: the reader sees a recording without its end
            if self.path.exists() or self._size:
                _append_private(self.path, member)
                self._size += len(member)
        details = {"reason": reason, "path": str(self.path), "bytes": self._size, "rounds": self.rounds,
                   "samples": self.samples}
        self._say("recording.stopped" if reason == "stopped" else "recording.capped", **details)


def _append_private(path: Path, data: bytes) -> None:
    """Append to a file only this user reads (the run's other files are 0600 too)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
    try:
        view = memoryview(data)
        while view:  # a regular file takes it whole but for a full disk, which raises
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def start(run_dir: Path, sd_url: SdSource, **options: Any) -> Recorder:
    """Start recording the run whose directory is `run_dir` from the exporters `sd_url` lists
    (options: interval, max_bytes, min_free_bytes, access, notify, meta; see Recorder)."""
    return Recorder(run_dir, sd_url, **options).start()


# --- reading -------------------------------------------------------------------------------------


def lines(path: Path, chunk: int = 1 << 20) -> Iterator[dict[str, Any]]:
    """Every whole line of a recording, member by member; a member cut short (a crash, or the
    recorder writing it right now) and anything after it are left out (`Recording.cut_short`)."""
    with open(path, "rb") as handle:
        decoder, fed, pending = zlib.decompressobj(31), False, b""
        while True:
            data = handle.read(chunk)
            if not data:
                break
            while data:
                try:
                    out = decoder.decompress(data)
                except zlib.error:
                    raise _CutShort from None
                fed = True
                pending += out
                if decoder.eof:
                    yield from _whole(pending)
                    pending = b""
                    data, decoder, fed = decoder.unused_data, zlib.decompressobj(31), False
                else:
                    data = b""
        if fed or pending:
            raise _CutShort


class _CutShort(Exception):
    pass


def _whole(text: bytes) -> Iterator[dict[str, Any]]:
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)


@dataclass
class Series:
    id: int
    family: str
    name: str
    labels: dict[str, str]
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


@dataclass
class Recording:
    path: Path
    meta: list[dict[str, Any]] = field(default_factory=list)  # one per recorder start (a run followed again)
    families: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {type, help}
    series: dict[int, Series] = field(default_factory=dict)
    ends: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0
    cut_short: bool = False  # the last gzip member is incomplete: a crash, or a recorder still writing

    @property
    def start(self) -> float | None:
        times = [s.times[0] for s in self.series.values() if s.times]
        return min(times) if times else None

    @property
    def end(self) -> float | None:
        times = [s.times[-1] for s in self.series.values() if s.times]
        return max(times) if times else None

    @property
    def capped(self) -> str | None:
        """Why the recording stopped early (a bound), if it did."""
        return next((e["reason"] for e in self.ends if e.get("reason") != "stopped"), None)

    def select(self, name: str, **labels: str) -> list[Series]:
        return [s for s in self.series.values()
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def read(path: Path) -> Recording:
    """The recording at `path` (a run dir or the file), whatever can be read of it. Raises
    FileNotFoundError when there is none."""
    path = path_of(path) if path.is_dir() else path
    recording = Recording(path)
    known: dict[int, Series] = {}  # ids restart when a recorder starts again on the same file
    try:
        for line in lines(path):
            kind = line.get("kind")
            if kind == "meta":
                recording.meta.append(line)
                known = {}
            elif kind == "family":
                recording.families.setdefault(line["name"], {"type": line["type"], "help": line.get("help", "")})
            elif kind == "series":
                key = len(recording.series)
                series = recording.series[key] = Series(key, line["family"], line["name"], line["labels"])
                known[line["id"]] = series
            elif kind == "scrape":
                recording.rounds += 1
                for ident, value in line["s"]:
                    series = known.get(ident)
                    if series is not None:
                        series.times.append(line["t"])
                        series.values.append(value)
            elif kind == "end":
                recording.ends.append(line)
    except (_CutShort, ValueError, KeyError, TypeError):
        recording.cut_short = True
    _merge_restarted(recording)
    return recording


def _merge_restarted(recording: Recording) -> None:
    """A recorder started again on the same file names its series anew: one series per name and labels."""
    by_key: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}
    for key, series in list(recording.series.items()):
        identity = (series.name, tuple(sorted(series.labels.items())))
        first = by_key.setdefault(identity, series)
        if first is not series:
            first.times += series.times
            first.values += series.values
            del recording.series[key]
