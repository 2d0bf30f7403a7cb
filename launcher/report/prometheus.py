"""A report's data from the user's Prometheus instead of a recording (a run submitted with
`--prometheus URL` is not recorded twice), and the alerts that fired during the run, read through
the launcher's one bounded Prometheus client (launcher/promql.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher import recording
from launcher.promql import MatrixSeries, Prometheus, shown
from launcher.record_alerts import FIRING, of_clusters
from launcher.recording import Recording, Series

MAX_POINTS = 1500  # per series: Prometheus refuses more than 11000 points per series anyway


def query_range(base: str, expr: str, start: float, end: float, step: float | None = None) -> list[MatrixSeries]:
    step = step or max(1.0, (end - start) / MAX_POINTS)
    return Prometheus(base).query_range(expr, start, end, step)


def selector(matchers: dict[str, str] | None = None) -> str:
    """The recorder's allow-list as one PromQL selector, with label equalities (e.g. the cluster)."""
    names = [f"{prefix}.*" for prefix in recording.ALLOWED_PREFIXES]
    names += [*sorted(recording.ALLOWED_FAMILIES), recording.UP]
    extra = "".join(f',{key}="{value}"' for key, value in sorted((matchers or {}).items()))
    return '{__name__=~"' + "|".join(names) + '"' + extra + "}"


def read(base: str, start: float, end: float, matchers: dict[str, str] | None = None) -> Recording:
    """What the recorder would have kept, as this Prometheus has it for [start, end]."""
    rec = Recording(Path(shown(base)))
    for item in query_range(base, selector(matchers), start, end):
        labels = dict(item.metric)
        name = labels.pop("__name__", None)
        if name is None:  # the selector names every series it gives; a store that drops names gives nothing
            continue
        family = name.removesuffix("_total")
        rec.families.setdefault(family, {"type": "counter" if name.endswith("_total") else "gauge", "help": ""})
        series = rec.series[len(rec.series)] = Series(len(rec.series), family, name, labels)
        for at, value in item.values:
            series.times.append(float(at))
            series.values.append(value)
    return rec


def fired(base: str, start: float, end: float, clusters: set[str]) -> list[dict[str, Any]]:
    """Alerts firing at any point of [start, end] (of the run's clusters, or without a cluster label):
    name, severity, labels, first and last time seen firing."""
    found = []
    for item in query_range(base, FIRING, start, end):
        labels = dict(item.metric)
        if not of_clusters(labels, clusters):
            continue
        times = [at for at, _ in item.values]
        found.append({"alertname": labels.pop("alertname", "?"), "severity": labels.pop("severity", ""),
                      "labels": {k: v for k, v in labels.items() if k not in ("__name__", "alertstate")},
                      "first": min(times), "last": max(times)})
    return sorted(found, key=lambda alert: (alert["first"], alert["alertname"]))
