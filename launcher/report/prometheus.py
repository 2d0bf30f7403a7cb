"""A report's data from the user's Prometheus instead of a recording (a run submitted with
`--prometheus URL` is not recorded twice), and the alerts that fired during the run.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from launcher import recording
from launcher.recording import Recording, Series

TIMEOUT_S = 30.0
MAX_POINTS = 1500  # per series: Prometheus refuses more than 11000 points per series anyway


def _get(base: str, path: str, params: dict[str, Any]) -> Any:
    url = f"{base.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        reply = json.loads(response.read())
    if reply.get("status") != "success":
        raise ValueError(f"{url}: {reply.get('error') or reply}")
    return reply["data"]


def query_range(base: str, expr: str, start: float, end: float, step: float | None = None) -> list[dict[str, Any]]:
    step = step or max(1.0, (end - start) / MAX_POINTS)
    return _get(base, "/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": f"{step:g}"})["result"]


def selector(matchers: dict[str, str] | None = None) -> str:
    """The recorder's allow-list as one PromQL selector, with label equalities (e.g. the cluster)."""
    names = [f"{prefix}.*" for prefix in recording.ALLOWED_PREFIXES]
    names += [*sorted(recording.ALLOWED_FAMILIES), recording.UP]
    extra = "".join(f',{key}="{value}"' for key, value in sorted((matchers or {}).items()))
    return '{__name__=~"' + "|".join(names) + '"' + extra + "}"


def read(base: str, start: float, end: float, matchers: dict[str, str] | None = None) -> Recording:
    """What the recorder would have kept, as this Prometheus has it for [start, end]."""
    rec = Recording(Path(base))
    for item in query_range(base, selector(matchers), start, end):
        labels = dict(item["metric"])
        name = labels.pop("__name__")
        family = name.removesuffix("_total")
        rec.families.setdefault(family, {"type": "counter" if name.endswith("_total") else "gauge", "help": ""})
        series = rec.series[len(rec.series)] = Series(len(rec.series), family, name, labels)
        for at, value in item["values"]:
            series.times.append(float(at))
            series.values.append(float(value))
    return rec


def fired(base: str, start: float, end: float, clusters: set[str]) -> list[dict[str, Any]]:
    """Alerts firing at any point of [start, end] (of the run's clusters, or without a cluster label):
    name, severity, labels, first and last time seen firing."""
    found = []
    for item in query_range(base, 'ALERTS{alertstate="firing"}', start, end):
        labels = dict(item["metric"])
        if clusters and labels.get("cluster", "") not in clusters | {""}:
            continue
        times = [float(at) for at, _ in item["values"]]
        found.append({"alertname": labels.pop("alertname", "?"), "severity": labels.pop("severity", ""),
                      "labels": {k: v for k, v in labels.items() if k not in ("__name__", "alertstate")},
                      "first": min(times), "last": max(times)})
    return sorted(found, key=lambda alert: (alert["first"], alert["alertname"]))
