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
    {"kind": "end", "t": ..., "reason": "stopped" | "size cap of 256 MiB reached" | "disk nearly full: ...",
     "rounds": 40, "dropped": 0}

A series is named once and then referred to by id. Every target also gets Prometheus's synthetic
`up` series (1 read, 0 not), with the target labels Prometheus would give it (those of /sd plus
`job` and `instance`), so a backfilled recording selects like live data.

Within a budget at any length: `max_bytes` is met by rolling older rounds up (per minute, then per 5
minutes; launcher/record_compaction.py), keeping every round of the last hours and around each fault,
restart, recovery and alert (`mark` lines, written when a WATCHED series changes, the run calls mark(), or
the run's Prometheus says an alert fires: launcher/record_alerts.py). Above
record_fleet.FLEET_NODES targets a round keeps the fleet's distributions (`fleet:<metric>:<operation>`
series) and only the outlying, faulty or asked-for nodes' own series (launcher/record_fleet.py). Two more
lines then:

    {"kind": "mark", "t": ..., "why": "node-7: a fault or recovery series changed"}
    {"kind": "mark", "t": ..., "until": ..., "why": "alert RaypulseGpuXid on node-7 firing"}
    {"kind": "rollup", "t0": ..., "t": ..., "step": 60, "n": 4, "s": [[7, min, max, mean, last], ...]}

The recorder stops (and says so, in the file and to `notify`) only when even its last hour at full
resolution would pass `max_bytes`, or when the disk under the run dir has less than `min_free_bytes`
left. Nothing else ends it: a target that cannot be read (gone, slow, broken; read through
launcher/health/exporters.py's bounded reader) is `up` 0 for the round, and a round that fails is
skipped. Only Prometheus names are kept: a sample whose metric name or a label name is not one (a
quoted UTF-8 name, which could forge samples in `launcher export`) is left out and counted (`dropped`
in the end line and in `notify`).

Its record has its ends: a round right when an attempt starts (`record_soon`) and when it ends (the
run calls `record_once`, before the job's processes and exporters go away), and a last one at `stop()`.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import math
import os
import re
import shutil
import threading
import time
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from alerts.config import DEFAULT as ALERTS_CONFIG
from exporter.contract import wire
from launcher import exposition, record_compaction, record_fleet
from launcher.health import exporters
from launcher.health.exporters import ReadError, fetch_sd
from launcher.promql import PrometheusError
from launcher.record_alerts import AlertWatch
from launcher.record_compaction import Ages
from launcher.state import FILE_MODE, ExporterAccess, private_dir

FILE_NAME = "metrics.jsonl.gz"
FORMAT_VERSION = 1
DEFAULT_INTERVAL_S = 15.0
DEFAULT_MAX_BYTES = 256 * 2**20
DEFAULT_MIN_FREE_BYTES = 1 * 2**30  # never take the disk's last GiB
READ_TIMEOUT_S = 5.0
ROUND_READS_S = 2 * READ_TIMEOUT_S  # every target's reads of a round, together (within the default interval)
STOP_WAIT_S = 3 * READ_TIMEOUT_S  # /sd, then the scrapes in parallel
# Targets read ahead of the one being written: their parsed samples are all the round holds at once
# (the reads themselves share the launcher's one pool, exporters.MAX_PARALLEL at a time).
READ_AHEAD = 2 * exporters.MAX_PARALLEL
# The budget (docs/reports.md): full resolution for the recent hours, per-minute then per-5-minute rollups
# beyond, and whole around every fault, restart and recovery; each level is tried in turn while the file
# stays above half of max_bytes. The last hour is full resolution at every level.
LEVELS = (Ages(6 * 3600, 24 * 3600), Ages(3 * 3600, 12 * 3600), Ages(3600, 6 * 3600), Ages(3600, 3600),
          Ages(3600, 3600, protect=False))
COMPACT_EVERY_S = 3600.0  # of the run's time: how often older rounds are rolled up
WINDOW_S = 600.0  # kept whole either side of a fault, restart or recovery; a fleet's outlier kept this long
NEW_WINDOWS = 16  # per round, at most this many more nodes get a window of their own
# Series whose change is a fault or a recovery (a window is kept whole around it), with their healthy value.
WATCHED = {"up": 1.0, "raypulse_gpu_up": 1.0, "raypulse_ray_node_alive": 1.0, "raypulse_gpu_xid_errors_total": 0.0,
           "raypulse_gpu_ecc_errors_total": 0.0, "raypulse_gpu_lost_events_total": 0.0,
           "raypulse_gpu_row_remap_pending": 0.0, "raypulse_gpu_row_remap_failed": 0.0}

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
CAP_REASON = "size cap of"  # a file too small for even the last hour at full resolution
UP = "up"  # Prometheus's own per-target series, as it would record it
# Prometheus names (the classic ones promtool's OpenMetrics parser takes unquoted); `__*` label names
# are Prometheus's own (`__name__` would rename a series).
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


_ALLOWED = exposition.keeping(ALLOWED_FAMILIES, ALLOWED_PREFIXES)  # allowed(), for reading an answer


def valid_names(name: str, labels: Mapping[str, str]) -> bool:
    """Whether a sample's metric name and label names are Prometheus names we can write back out."""
    return bool(METRIC_NAME.fullmatch(name)) and all(
        LABEL_NAME.fullmatch(key) and not key.startswith("__") for key in labels)


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
    # Another transport than HTTP(S) to `address` (a KubeRay pod through the API server's proxy).
    reader: exporters.Reader | None = field(default=None, compare=False)

    @functools.cached_property
    def key(self) -> TargetKey:
        """The target as its series are named: its address and its labels (a relabelled target starts over);
        worked out once (a round needs it several times, for thousands of targets)."""
        return self.address, tuple(sorted(self.labels.items()))


def discover(sd_url: str, access: ExporterAccess | None = None, timeout: float = READ_TIMEOUT_S) -> list[ScrapeTarget]:
    """The raypulse exporters /sd lists, with the target labels Prometheus would give them. Groups
    that carry their own scrape job (node_exporter beside ours) are not ours: skipped."""
    found = []
    for group in fetch_sd(sd_url, access, timeout):
        # Label names that are not Prometheus names are left out: they would be written into every series.
        labels = {str(k): str(v) for k, v in (group.get("labels") or {}).items()
                  if LABEL_NAME.fullmatch(str(k)) and not str(k).startswith("__")}
        if wire.SD_JOB_LABEL in labels:
            continue
        for address in group.get("targets") or []:
            found.append(ScrapeTarget(address, {**labels, wire.SD_JOB_LABEL: ALERTS_CONFIG.scrape_job,
                                                "instance": address}))
    return found


@functools.cache
def _plan() -> tuple[tuple[str, frozenset[str]], ...]:
    """A round's requests to an exporter that knows `name[]`: each path and the names it asks for."""
    return tuple((wire.metrics_path(names), frozenset(names)) for names in requested())


@functools.cache
def requested() -> tuple[tuple[str, ...], ...]:
    """The names a round asks every exporter for, in requests of at most wire.METRICS_MAX_NAMES: every
    family of the exporter's catalog that is kept (the catalog lists them all: no second list here)."""
    from exporter.framework.catalog import CATALOG  # the catalog fills as the collector modules are imported
    from exporter.framework.collector import load_collectors

    load_collectors()
    names = sorted(spec.name for spec in CATALOG if allowed(spec.name))
    step = wire.METRICS_MAX_NAMES
    return tuple(tuple(names[index:index + step]) for index in range(0, len(names), step))


@functools.cache
def _keeping(names: frozenset[str]) -> re.Pattern[str]:
    """What a request for `names` keeps of its answer (one of requested())."""
    return exposition.keeping(names)


def _only(text: str, names: frozenset[str]) -> bool:
    """Whether an answer holds only the families asked for (an exporter that knows `name[]`)."""
    return all((name := exposition.name_of(line)) is None or name in names or name.endswith("_created")
               for line in text.splitlines())


@dataclass
class Sample:
    family: str
    type: str
    help: str
    name: str
    labels: dict[str, str]
    value: float


TargetKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class _Kept:
    """A target's answer to one request as the file has it: per sample line, a hash of the line and of its
    series (exposition.Read's), its series id (-1: left out for its names) and value; and the answer's ETag
    (an unchanged answer is a 304: these values again). A line that comes back unchanged at its place is not
    parsed again, nor one of the same series there with another value (only its value is read)."""

    etag: str | None
    keys: array
    series: array
    ids: array
    values: array
    dropped: int = field(init=False)  # lines left out for their names, each round this answer stands

    def __post_init__(self) -> None:
        self.dropped = self.ids.count(-1)


@dataclass
class _Part:
    """One request's outcome for a target: None for a 304; else per sample line of the answer (`keys` and
    `series`: exposition.Read's), the position of the same line in the last answer, the same series there
    with a new value (exposition.Value), a new Sample, or None (left out)."""

    path: str
    etag: str | None
    keys: array | None = None
    items: list[int | exposition.Value | Sample | None] | None = None
    series: array | None = None
    dropped: list[str] = field(default_factory=list)


def _sample(line: exposition.Line, target_labels: Mapping[str, str], dropped: list[str]) -> Sample | None:
    """A parsed sample as recorded (target labels added as Prometheus adds them: an exposed label that a
    target label also names becomes `exported_<name>`), or None (and its name in `dropped`) when its
    names are not Prometheus names."""
    if not (valid_names(line.name, line.labels) and METRIC_NAME.fullmatch(line.family.name)):
        dropped.append(ascii(f"{line.name}{{{','.join(line.labels)}}}")[:120])
        return None
    labels = {(f"exported_{k}" if k in target_labels else k): v for k, v in line.labels.items()}
    return Sample(line.family.name, line.family.type, line.family.help, line.name, {**labels, **target_labels},
                  line.value)


# --- writing -------------------------------------------------------------------------------------


Notify = Callable[[str, Mapping[str, Any]], None]
# Where /sd is: a URL, or a callable that gives it once known (a local cluster starts its exporters
# after the job runs) and None until then.
# The head exporter's /sd URL, or a callable giving it (None: not known yet), or giving the targets
# themselves (KubeRay: the RayJob's pods, listed through the API server).
SdSource = str | Callable[[], str | list[ScrapeTarget] | None]


class Recorder:
    """Records one run while it lives. `start()` and `stop()` may be called from any thread;
    `stop()` is idempotent and returns once the file is closed."""

    def __init__(self, run_dir: Path, sd_url: SdSource, *, interval: float = DEFAULT_INTERVAL_S,
                 max_bytes: int = DEFAULT_MAX_BYTES, min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
                 access: ExporterAccess | None = None, notify: Notify | None = None,
                 meta: Mapping[str, Any] | None = None, fleet_nodes: int = record_fleet.FLEET_NODES,
                 record_nodes: frozenset[str] = frozenset(), levels: tuple[Ages, ...] = LEVELS,
                 window_s: float = WINDOW_S, clock: Callable[[], float] = time.time,
                 alerts: AlertWatch | None = None) -> None:
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
        self.dropped = 0  # samples left out for names that are not Prometheus names
        self.ended: str | None = None  # why it stopped, once it has
        # A series' id by a hash of its name and labels (a 64-bit hash: a collision among a run's few
        # hundred thousand series is about 1e-9 likely; keeping the label tuples took most of the memory).
        self._series: dict[int, int] = {}
        self._known: dict[TargetKey, dict[str, _Kept]] = {}  # by target, by request path: its last answer
        # A sample name's family, type and help, as the last whole parse that had it said (a changed line
        # is parsed alone, without its family's HELP and TYPE lines).
        self._family_of: dict[str, exposition.Family] = {}
        self._families: set[str] = set()
        self._targets: list[ScrapeTarget] = []
        self._stop = threading.Event()
        self._wake = threading.Event()  # a round now (record_soon), or the stop
        self._failing: dict[str, str] = {}  # targets that could not be read, by address: why (said once)
        self._round_failed: str | None = None  # the last failed round's error (said once)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # the file and `ended`
        self._round = threading.Lock()  # one round at a time (the loop's, or a caller's record_once)
        self._size = 0
        self.fleet_nodes = fleet_nodes  # above this many targets a round keeps distributions (record_fleet)
        self.record_nodes = record_nodes  # nodes whose own series are kept whatever the fleet's size
        self.levels = levels
        self.window_s = window_s
        self.clock = clock  # a round's time (a bench or test advances it)
        self._fleet = record_fleet.Fleet()
        self._named: set[int] = set()  # series whose `series` line is written (a fleet's: only those kept)
        self._aggregates: dict[tuple[int, str], int] = {}  # (fleet key, operation) -> series id
        self._watch = _Column(math.nan)  # per series id: its healthy value if WATCHED, else NaN
        self._last = _Column(math.nan)  # per watched series id: its last value
        self._keep_until: dict[TargetKey, float] = {}  # a fleet's nodes kept whole, until when
        self._marks: list[tuple[float, float]] = []  # windows kept whole (sorted, merged)
        self._level = 0  # LEVELS' index now in force
        self._first_at: float | None = None
        self._last_at: float | None = None
        self._compacted_at = -math.inf
        self._pending_marks: list[tuple[float, str]] = []  # mark() calls not yet in the file
        self.alerts = alerts  # the run's Prometheus, asked for its firing alerts (launcher/record_alerts.py)
        self._alerts_failed: str | None = None  # the last failed ask's error (said once)

    # -- life --

    def start(self) -> Recorder:
        private_dir(self.path.parent)
        with contextlib.suppress(FileNotFoundError):
            self._size = self.path.stat().st_size  # the same run followed again: appended to
            self._marks = _windows(_marks_in(self.path), self.window_s)
        if not self._append([{"kind": "meta", "version": FORMAT_VERSION, "started": self.clock(),
                               "interval": self.interval, "max_bytes": self.max_bytes,
                               **self.meta}]):
            return self  # refused by a bound: `ended` says why, and notify was told
        self._say("recording.started", path=str(self.path), interval=self.interval, max_bytes=self.max_bytes)
        self._thread = threading.Thread(target=self._loop, name="recorder", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """A last round (the run's final values: its last up-to-`interval` seconds would be missing
        otherwise), then the file's end."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT_S)  # a round in flight ends within its read timeouts
            self._guarded_round()
        self._end("stopped")

    def record_soon(self) -> None:
        """A round on the recorder's own thread, now rather than at the next interval (an attempt
        started); returns at once."""
        self._wake.set()

    def mark(self, why: str) -> None:
        """Keep the record whole around now (an attempt started or ended, a heal): WINDOW_S either side."""
        self._pending_marks.append((self.clock(), why))

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
            self._guarded_round()
            if self.ended:
                return
            next_at = max(next_at + self.interval, time.monotonic())  # a slow round is not caught up on
            if self._wake.wait(max(0.0, next_at - time.monotonic())):
                self._wake.clear()
                next_at = time.monotonic()  # the interval counts from a round asked for

    def _guarded_round(self) -> None:
        """A round that cannot end the recording: only the bounds and stop() do. A round that fails is
        said once (until one works again) and skipped."""
        try:
            self.record_once()
        except Exception as exc:  # noqa: BLE001 - the recorder never takes the run, or itself, down
            error = f"{type(exc).__name__}: {exc}"
            if error != self._round_failed:
                self._say("recording.round_failed", error=error)
            self._round_failed = error
            return
        self._round_failed = None

    def record_once(self) -> None:
        """One round: discover, scrape every target, append what is kept."""
        with self._round:
            self._record_round()

    def _record_round(self) -> None:
        if self.ended:
            return
        source = self.sd_url() if callable(self.sd_url) else self.sd_url
        if isinstance(source, list):
            self._targets = source or self._targets  # none listed (the API server away): the ones known last
        elif source:
            with contextlib.suppress(OSError, ValueError):  # /sd gone for a while: the targets known last
                self._targets = discover(source, self.access)
        if not self._targets:
            return  # no exporter known yet: nothing to write
        at = self.clock()
        targets = list(self._targets)
        listed = {target.key for target in targets}
        for key in [key for key in self._known if key not in listed]:  # gone from /sd (or relabelled)
            del self._known[key]
        deadline = time.monotonic() + ROUND_READS_S
        # Streamed: each target's samples become ids and values as its read comes back, READ_AHEAD targets
        # in flight; the round holds every target's ids and values (kept anyway), never its parsed samples.
        lines = _Member()  # the round's new family and series lines, compressed as they come
        taken: list[tuple[ScrapeTarget, np.ndarray, np.ndarray]] = []
        dropped: list[str] = []
        dropped_count = 0
        window: deque[tuple[ScrapeTarget, Future[tuple[list[_Part] | None, str | None]]]] = deque()
        pending = iter(targets)
        while True:
            for target in pending:
                window.append((target, exporters.pool().submit(self._read, target, deadline)))
                if len(window) >= READ_AHEAD:
                    break
            if not window:
                break
            done, future = window.popleft()
            ids, values, left_out, examples = self._take(done, *future.result(), lines)
            taken.append((done, ids, values))
            dropped_count, dropped = dropped_count + left_out, dropped or examples
        faulty = self._faults(at, taken, lines)
        if len(taken) > self.fleet_nodes:
            pairs = self._fleet_round(at, taken, faulty, lines, deadline)
        else:
            pairs = [self._whole(target, ids, values, lines, deadline) for target, ids, values in taken]
        count = sum(len(ids) for ids, _ in pairs)
        lines.text('{"kind":"scrape","t":' + json.dumps(round(at, 3)) + ',"s":[')
        first = True
        for ids, values in pairs:
            if len(ids):
                text = json.dumps(list(zip(ids.tolist(), values.tolist(), strict=True)), separators=(",", ":"))
                lines.text(text[1:-1] if first else "," + text[1:-1])
                first = False
        lines.text("]}\n")
        self._last_at = at
        if self._first_at is None:
            self._first_at = at
        if self._write(lines.close()):
            self.rounds += 1
            self.samples += count
            if dropped_count and not self.dropped:
                self._say("recording.samples_dropped", dropped=dropped_count,
                          example=dropped[0] if dropped else "(as the last round)")
            self.dropped += dropped_count
            self._compact_if_due(at)

    def _faults(self, at: float, taken: list[tuple[ScrapeTarget, np.ndarray, np.ndarray]], lines: _Member) \
            -> set[int]:
        """The targets (their index in `taken`) one of whose WATCHED series changed this round (or first
        showed an unhealthy value): each is a fault or a recovery, whose window is kept whole."""
        faulty: set[int] = set()
        if taken:
            ids = np.concatenate([ids for _, ids, _ in taken])
            values = np.concatenate([values for _, _, values in taken])
            owner = np.repeat(np.arange(len(taken)), [len(ids) for _, ids, _ in taken])
            healthy = self._watch.get(np.maximum(ids, 0))
            watched = (ids >= 0) & ~np.isnan(healthy)
            ids, values, healthy, owner = ids[watched], values[watched], healthy[watched], owner[watched]
            last = self._last.get(ids)
            changed = np.where(np.isnan(last), values != healthy, values != last)
            self._last.set(ids, values)
            for index in sorted(set(owner[changed].tolist())):
                faulty.add(index)
                target = taken[index][0]
                self._pending_marks.append((at, f"{target.labels.get('node', target.address)}: a fault or "
                                                "recovery series changed"))
        for when_, why in self._pending_marks:
            self._mark(lines, when_, why)
        self._pending_marks = []
        self._alert_windows(at, lines)
        return faulty

    def _mark(self, lines: _Member, at: float, why: str, until: float | None = None) -> None:
        """A `mark` line, and its window kept whole from now on: `window_s` either side of `at` (to `until`)."""
        line: dict[str, Any] = {"kind": "mark", "t": round(at, 3), "why": why}
        if until is not None and until != at:
            line["until"] = round(until, 3)
        lines.line(line)
        self._marks = _windows([{"t": at, "until": until if until is not None else at}], self.window_s, self._marks)

    def _alert_windows(self, at: float, lines: _Member) -> None:
        """The run's firing alerts, when its Prometheus is due to be asked: each alert window kept whole as a
        fault's is. An ask that fails is said once (until one works again); the windows open stay open."""
        if self.alerts is None or not self.alerts.due(at):
            return
        clusters = {target.labels["cluster"] for target in self._targets if target.labels.get("cluster")}
        try:
            found = self.alerts.ask(at, clusters, self.window_s)
        except PrometheusError as exc:
            if str(exc) != self._alerts_failed:
                self._say("recording.alerts_unread", error=str(exc))
            self._alerts_failed = str(exc)
            return
        self._alerts_failed = None
        for since, until, why in found.lines:
            self._mark(lines, since, why, until)
        self._marks = _windows([{"t": since, "until": until} for since, until in found.firing], self.window_s,
                               self._marks)

    def _fleet_round(self, at: float, taken: list[tuple[ScrapeTarget, np.ndarray, np.ndarray]], faulty: set[int],
                     lines: _Member, deadline: float) -> list[tuple[np.ndarray, np.ndarray]]:
        """A large cluster's round: the distributions (record_fleet), and the series of the nodes kept whole
        (outliers, faulty, --record-nodes, and those whose window is still open)."""
        reduced = self._fleet.reduce([(ids, values) for _, ids, values in taken])
        agg_ids, agg_values = [], []
        for position, key in enumerate(reduced.keys.tolist()):
            name, labels = self._fleet.keys[key]
            for operation in record_fleet.OPERATIONS:
                ident = self._aggregates.get((key, operation))
                if ident is None:
                    aggregate = record_fleet.series_name(name, operation)
                    sample = Sample(aggregate, "gauge", f"the fleet's {operation} of {name} across nodes", aggregate,
                                    dict(labels), 0.0)
                    ident = self._aggregates[(key, operation)] = self._series_id(sample, lines, aggregate=False)
                agg_ids.append(ident)
                agg_values.append(float(reduced.stats[operation][position]))
        pairs = [(np.array(agg_ids, np.int64), np.array(agg_values))]
        def is_open(index: int) -> bool:
            return self._keep_until.get(taken[index][0].key, -math.inf) >= at

        # Faulty nodes first, then the farthest out; at most NEW_WINDOWS new ones a round (a whole fleet
        # flapping at once is in its distributions, not in 2,000 nodes' own series).
        newcomers = [i for i in sorted(faulty) if not is_open(i)] + \
            [i for _, i in sorted(((-score, i) for i, score in reduced.outliers.items()
                                   if i not in faulty and not is_open(i)))]
        opened = set(newcomers[:NEW_WINDOWS])
        for index in sorted(opened - faulty):  # a node that starts to stand out matters as a fault does
            self._mark(lines, at, f"{taken[index][0].labels.get('node', '?')}: an outlier")
        opened |= {index for index in [*reduced.outliers, *faulty] if is_open(index)}  # still out: kept longer
        for index in opened:
            self._keep_until[taken[index][0].key] = at + self.window_s
        for target, ids, values in taken:
            key = target.key
            if target.labels.get("node") in self.record_nodes or self._keep_until.get(key, -math.inf) >= at:
                pairs.append(self._whole(target, ids, values, lines, deadline))
            elif key in self._keep_until:
                del self._keep_until[key]
        return pairs

    def _whole(self, target: ScrapeTarget, ids: np.ndarray, values: np.ndarray, lines: _Member,
               deadline: float) -> tuple[np.ndarray, np.ndarray]:
        """A node's own series for the round, every one named (those first seen while the cluster was
        large are named now)."""
        named = np.fromiter((ident >= 0 and ident in self._named for ident in ids.tolist()), bool, len(ids))
        if not named.all():
            self._name_all(target, {ident for ident in ids[~named].tolist() if ident >= 0}, lines, deadline)
            named = np.fromiter((ident >= 0 and ident in self._named for ident in ids.tolist()), bool, len(ids))
        return ids[named], values[named]

    def _name_all(self, target: ScrapeTarget, missing: set[int], lines: _Member, deadline: float) -> None:
        """Write the `series` lines of a kept node's series not named yet: its answer is read again whole
        (the round's parse kept ids and values, not labels)."""
        if not missing:
            return
        answer, _ = self._read(target, max(deadline, time.monotonic() + READ_TIMEOUT_S), fresh=True)
        for part in answer or []:
            for item in part.items or []:
                if isinstance(item, Sample):
                    ident = self._series.get(_hash(item))
                    if ident in missing:
                        self._name(ident, item, lines)

    def _read(self, target: ScrapeTarget, deadline: float, fresh: bool = False) \
            -> tuple[list[_Part] | None, str | None]:
        """A target's kept families, in requests of at most wire.METRICS_MAX_NAMES names each, each If-None-Match
        its last ETag; or why there are none (gone, refused, slow, a broken or unparsable body: its `up` is 0
        for the round). An exporter that does not know `name[]` answers with everything: kept as before
        (cut down here), and from then on read whole, once a round."""
        scheme = self.access.scheme if self.access else "http"
        base = f"{scheme}://{target.address}"
        known = {} if fresh else self._known.get(target.key, {})  # fresh: every line parsed (their labels)
        plan: tuple[tuple[str, frozenset[str] | None], ...] = ((wire.METRICS_PATH, None),) \
            if wire.METRICS_PATH in known else _plan()
        out = []
        for path, names in plan:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, f"not read within the round's {ROUND_READS_S:g}s"
            last = known.get(path)
            try:
                if target.reader is not None:
                    answer = target.reader(path, min(READ_TIMEOUT_S, left), last.etag if last else None)
                else:
                    answer = exporters.get_if_changed(base + path, self.access, min(READ_TIMEOUT_S, left),
                                                      last.etag if last else None, accept_gzip=True)
            except ReadError as exc:
                return None, str(exc)
            if answer.body is None:
                out.append(_Part(path, answer.etag))
                continue
            try:
                text = answer.body.decode(errors="replace")
                if names is not None and not _only(text, names):
                    return [self._part(wire.METRICS_PATH, answer.etag, text, target, _ALLOWED,
                                       known.get(wire.METRICS_PATH))], None
                keep = _keeping(names) if names is not None else _ALLOWED
                out.append(self._part(path, answer.etag, text, target, keep, last))
            except Exception as exc:  # noqa: BLE001 - prometheus_client's parser raises more than ValueError on garbage
                return None, f"an exposition that does not parse ({type(exc).__name__}: {str(exc)[:200]})"
        return out, None

    def _part(self, path: str, etag: str | None, text: str, target: ScrapeTarget, keep: re.Pattern[str],
              last: _Kept | None) -> _Part:
        """An answer's samples, parsing only the lines not in the last answer (launcher/exposition.py)."""
        answer = exposition.read(text, keep, last.keys if last is not None else None, self._family_of,
                                 last.series if last is not None else None)
        dropped: list[str] = []
        items = [item if isinstance(item, int | exposition.Value) else _sample(item, target.labels, dropped)
                 for item in answer.items]
        return _Part(path, etag, answer.keys, items, answer.series, dropped)

    def _take(self, target: ScrapeTarget, answer: list[_Part] | None, error: str | None,
              lines: _Member) -> tuple[np.ndarray, np.ndarray, int, list[str]]:
        """A target's read into the round: its `up`, then the values of every request (a 304's are the last
        ones). Returns their ids (-1: left out for its names) and values, the count left out, and an example."""
        self._note_target(target, error)
        up_value = 0.0 if answer is None else 1.0
        up_id = self._series.get(_named_hash(UP, target.key[1]))  # its `up`'s, known after its first round
        if up_id is None:
            up = Sample(UP, "gauge", "1 if the target answered its scrape, else 0 (as Prometheus records it)", UP,
                        dict(target.labels), up_value)
            up_id = self._series_id(up, lines, named=True)  # every target's `up` is named, a fleet's too
        id_parts = [np.array([up_id], np.int64)]
        value_parts = [np.array([up_value])]
        left_out, examples = 0, []
        if answer is None:
            self._known.pop(target.key, None)
        else:
            if wire.METRICS_PATH not in self._known.get(target.key, {}) and \
                    any(part.path == wire.METRICS_PATH for part in answer):  # read whole from now on
                self._known[target.key] = {}
            kept = self._known.setdefault(target.key, {})
            for part in answer:
                entry = kept.get(part.path)
                if part.items is not None and part.keys is not None and part.series is not None:
                    ids, values = array("q"), array("d")
                    for item in part.items:
                        if isinstance(item, int):  # the same line as last time
                            assert entry is not None
                            ids.append(entry.ids[item])
                            values.append(entry.values[item])
                        elif isinstance(item, exposition.Value):  # the same series, another value
                            assert entry is not None
                            ids.append(entry.ids[item.position])
                            values.append(item.value)
                        elif item is None:  # left out for its names
                            ids.append(-1)
                            values.append(0.0)
                        else:
                            ids.append(self._series_id(item, lines))
                            values.append(item.value)
                    entry = kept[part.path] = _Kept(part.etag, part.keys, part.series, ids, values)
                    examples += part.dropped[:1]
                if entry is not None:
                    id_parts.append(np.frombuffer(entry.ids, np.int64) if len(entry.ids) else np.zeros(0, np.int64))
                    value_parts.append(np.frombuffer(entry.values) if len(entry.values) else np.zeros(0))
                    left_out += entry.dropped
        return np.concatenate(id_parts), np.concatenate(value_parts), left_out, examples

    def _note_target(self, target: ScrapeTarget, error: str | None) -> None:
        """A target that stops answering is said once (and nothing while it stays so)."""
        if error is None:
            self._failing.pop(target.address, None)
        elif target.address not in self._failing:
            self._failing[target.address] = error
            self._say("recording.target_failed", target=target.address, node=target.labels.get("node"), error=error)

    def _series_id(self, sample: Sample, lines: _Member, *, aggregate: bool = True, named: bool = False) -> int:
        """A series' id; a new one is named in the file at once, but for a large cluster's nodes' series
        (not `named`): those are named when their node is kept whole (_name_all). `aggregate`: a node's
        series, part of the fleet's distributions."""
        key = _hash(sample)
        found = self._series.get(key)
        if found is not None:
            return found
        found = self._series[key] = len(self._series)
        if aggregate:
            self._fleet.note(found, sample.name, sample.labels)
        healthy = WATCHED.get(sample.name)
        if healthy is not None:
            self._watch.set(np.array([found]), np.array([healthy]))
        if named or not aggregate or len(self._targets) <= self.fleet_nodes:
            self._name(found, sample, lines)
        return found

    def _name(self, ident: int, sample: Sample, lines: _Member) -> None:
        if sample.family not in self._families:
            self._families.add(sample.family)
            lines.line({"kind": "family", "name": sample.family, "type": sample.type, "help": sample.help})
        self._named.add(ident)
        lines.line({"kind": "series", "id": ident, "family": sample.family, "name": sample.name,
                    "labels": sample.labels})

    # -- the budget --

    def _compact_if_due(self, at: float) -> None:
        """Roll older rounds up (record_compaction) once an hour of the run's time when it is older than the
        level's full resolution, and as soon as the file passes half of max_bytes; a level that leaves it
        above half gives way to the next."""
        age = at - (self._first_at if self._first_at is not None else at)
        due = at - self._compacted_at >= COMPACT_EVERY_S and age > self.levels[self._level].full_s
        large = self._size > self.max_bytes // 2 and at - self._compacted_at >= self.levels[-1].full_s / 12
        if due or large:
            with self._lock:
                self._compact_locked(at)

    def _compact_locked(self, at: float) -> None:
        while True:
            self._size = record_compaction.compact(self.path, lines(self.path), at, self.levels[self._level],
                                                   self._marks)
            if self._size <= self.max_bytes // 2 or self._level == len(self.levels) - 1:
                break
            self._level += 1
        self._compacted_at = at

    # -- the file --

    def _append(self, lines: list[dict[str, Any]]) -> bool:
        """One gzip member of `lines`, written whole or not at all (a round that would pass a bound is not)."""
        member = _Member()
        for line in lines:
            member.line(line)
        return self._write(member.close())

    def _write(self, member: bytes) -> bool:
        with self._lock:
            if self.ended:
                return False
            why = self._bound_passed(len(member))
            if why is not None and why.startswith(CAP_REASON) and self._last_at is not None:
                self._compact_locked(self._last_at)  # the budget: older rounds coarser, never a stop while it helps
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
            return f"{CAP_REASON} {_human(self.max_bytes)} reached"
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
        line = {"kind": "end", "t": round(self.clock(), 3), "reason": reason, "rounds": self.rounds,
                "dropped": self.dropped}
        member = gzip.compress((json.dumps(line) + "\n").encode(), mtime=0)
        with contextlib.suppress(OSError):  # a full disk: the reader sees a recording without its end
            if self.path.exists() or self._size:
                _append_private(self.path, member)
                self._size += len(member)
        details = {"reason": reason, "path": str(self.path), "bytes": self._size, "rounds": self.rounds,
                   "samples": self.samples, "dropped": self.dropped}
        self._say("recording.stopped" if reason == "stopped" else "recording.capped", **details)


class _Member:
    """One gzip member, compressed as its lines come: a round's text (a first round names every series)
    is never held whole, only its compressed bytes."""

    BATCH_CHARS = 1 << 16

    def __init__(self) -> None:
        self._compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip framing
        self._pending: list[str] = []
        self._pending_chars = 0
        self._out: list[bytes] = []

    def line(self, line: dict[str, Any]) -> None:
        self.text(json.dumps(line, separators=(",", ":")) + "\n")

    def text(self, text: str) -> None:
        self._pending.append(text)
        self._pending_chars += len(text)
        if self._pending_chars >= self.BATCH_CHARS:
            self._feed()

    def _feed(self) -> None:
        self._out.append(self._compressor.compress("".join(self._pending).encode()))
        self._pending, self._pending_chars = [], 0

    def close(self) -> bytes:
        self._feed()
        self._out.append(self._compressor.flush())
        return b"".join(self._out)


class _Column:
    """A float per series id, growing as ids are given out (NaN: not set)."""

    def __init__(self, fill: float) -> None:
        self.fill = fill
        self.data = np.full(1024, fill)

    def get(self, ids: np.ndarray) -> np.ndarray:
        out = np.full(len(ids), self.fill)
        inside = ids < len(self.data)
        out[inside] = self.data[ids[inside]]
        return out

    def set(self, ids: np.ndarray, values: np.ndarray) -> None:
        if len(ids) and ids.max() >= len(self.data):
            grown = np.full(max(2 * len(self.data), int(ids.max()) + 1), self.fill)
            grown[:len(self.data)] = self.data
            self.data = grown
        self.data[ids] = values


def _hash(sample: Sample) -> int:
    return _named_hash(sample.name, tuple(sorted(sample.labels.items())))


def _named_hash(name: str, sorted_labels: tuple[tuple[str, str], ...]) -> int:
    """A series' key in the recorder's index: its name and its labels, sorted."""
    return hash((name, sorted_labels))


def _windows(marks: list[dict[str, Any]], window_s: float,
             windows: list[tuple[float, float]] | None = None) -> list[tuple[float, float]]:
    """`windows` with a window of `window_s` either side of each mark added (sorted, merged): of its time, or of
    its time to its `until` (an alert's window)."""
    spans = sorted([*(windows or []), *((m["t"] - window_s, m.get("until", m["t"]) + window_s) for m in marks)])
    merged: list[tuple[float, float]] = []
    for low, high in spans:
        if merged and low <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


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


def start(run_dir: Path, sd_url: SdSource, prometheus: str | None = None, **options: Any) -> Recorder:
    """Start recording the run whose directory is `run_dir` from the exporters `sd_url` lists
    (options: interval, max_bytes, min_free_bytes, access, notify, meta; see Recorder); `prometheus`: the
    run's, asked for its firing alerts (launcher/record_alerts.py)."""
    alerts = AlertWatch(prometheus) if prometheus else None
    return Recorder(run_dir, sd_url, alerts=alerts, **options).start()


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
    marks: list[dict[str, Any]] = field(default_factory=list)  # faults, restarts, recoveries: kept whole around
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
            elif kind == "rollup":
                recording.rounds += line["n"]
                for ident, low, high, mean, last in line["s"]:
                    series = known.get(ident)
                    if series is not None:
                        series.times.append(line["t"])
                        series.values.append(_rolled(series, low, high, mean, last))
            elif kind == "mark":
                recording.marks.append(line)
            elif kind == "end":
                recording.ends.append(line)
    except (_CutShort, ValueError, KeyError, TypeError):
        recording.cut_short = True
    _merge_restarted(recording)
    return recording


def _marks_in(path: Path) -> list[dict[str, Any]]:
    """The marks of a recording (a recorder following the run again keeps its windows whole too)."""
    found: list[dict[str, Any]] = []
    with contextlib.suppress(_CutShort, ValueError):
        found += (line for line in lines(path) if line.get("kind") == "mark")
    return found


def _rolled(series: Series, low: float, high: float, mean: float, last: float) -> float:
    """A rollup's one value for a series' curve: a fleet's min and max stay extremes, a counter its last
    value (rates stay right), anything else its mean."""
    if series.name.endswith(":min"):
        return low
    if series.name.endswith(":max"):
        return high
    return last if "_total" in series.name else mean


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
