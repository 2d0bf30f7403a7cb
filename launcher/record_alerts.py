"""The run's firing alerts, for its record (launcher/recording.py keeps the record whole around each alert
window as it does around a fault): when the run has a Prometheus that evaluates raypulse's rules, the
recorder asks it for `ALERTS{alertstate="firing"}` of the run's clusters (their `cluster` label, or none:
the alerts a report lists, launcher/report/prometheus.py) every ASK_EVERY_S of the run's time, through the
launcher's one bounded client (launcher/promql.py) with a short deadline and small byte caps, and keeps at
most MAX_ALERTS alerts of an answer.

An alert's window is from when it was first seen firing to when it was last seen so; the recorder keeps it
whole, `window_s` either side. Asked every minute, an alert that began between two asks began within the
ten minutes kept before it. Each alert is a `mark` line with `until` when it starts firing, again each
time it has fired half a window longer than the file says (a recorder cut short leaves its window known
to within that), and once more when it is seen resolved.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.promql import Prometheus

FIRING = 'ALERTS{alertstate="firing"}'
ASK_EVERY_S = 60.0
TIMEOUT_S = 3.0  # within a round's reads: the exporters' read deadline
MAX_WIRE_BYTES = 4 * 2**20  # an alert is ~300 bytes: thousands fit
MAX_INFLATED_BYTES = 16 * 2**20
MAX_ALERTS = 1000


def of_clusters(labels: Mapping[str, str], clusters: set[str]) -> bool:
    """An alert of the run: one of its clusters', or one without a cluster label (every alert when none is known)."""
    return not clusters or labels.get("cluster", "") in clusters | {""}


def name_of(labels: Mapping[str, str]) -> str:
    """An alert as a mark says it: its name, and its node when it has one."""
    node = labels.get("node") or labels.get("instance")
    return f"alert {labels.get('alertname', '?')}" + (f" on {node}" if node else "")


@dataclass
class Window:
    """One alert's time firing, as seen by the asks: first and last seen, and how far the file knows it."""

    why: str
    since: float
    last: float
    written: float  # the `until` of its last mark line


@dataclass
class Marks:
    """What an ask found: mark lines to write (t, until, why), and the windows of the alerts firing now."""

    lines: list[tuple[float, float, str]]
    firing: list[tuple[float, float]]


class AlertWatch:
    """Asks one Prometheus for the run's firing alerts, at most every `every` seconds of the run's time."""

    def __init__(self, url: str, every: float = ASK_EVERY_S) -> None:
        self.prometheus = Prometheus(url, timeout=TIMEOUT_S, max_wire_bytes=MAX_WIRE_BYTES,
                                     max_inflated_bytes=MAX_INFLATED_BYTES)
        self.every = every
        self._asked_at = -math.inf
        self._open: dict[tuple[tuple[str, str], ...], Window] = {}  # by the alert's labels

    def due(self, at: float) -> bool:
        return at >= self._asked_at + self.every

    def ask(self, at: float, clusters: set[str], window_s: float) -> Marks:
        """The run's alerts firing now, as of `at` (the run's time), for a record kept whole `window_s` either side
        of each; raises PrometheusError (the caller says it, and asks again at the next cadence: a window stays
        open until an answer says it ended)."""
        self._asked_at = at
        samples = self.prometheus.query(FIRING)
        seen = set()
        lines: list[tuple[float, float, str]] = []
        for sample in samples:
            labels = {key: value for key, value in sample.metric.items() if key not in ("__name__", "alertstate")}
            if not of_clusters(labels, clusters):
                continue
            key = tuple(sorted(labels.items()))
            window = self._open.get(key)
            if window is None:
                if len(self._open) >= MAX_ALERTS:
                    continue
                window = self._open[key] = Window(name_of(labels), at, at, at)
                lines.append((at, at, f"{window.why} firing"))
            window.last = at
            if at - window.written >= window_s / 2:
                window.written = at
                lines.append((window.since, at, f"{window.why} firing"))
            seen.add(key)
        for key in [key for key in self._open if key not in seen]:
            window = self._open.pop(key)
            lines.append((window.since, window.last, f"{window.why} resolved"))
        return Marks(lines, [(window.since, window.last) for window in self._open.values()])
