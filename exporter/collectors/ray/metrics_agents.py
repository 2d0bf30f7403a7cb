"""Every Ray node's metrics agent, for the head exporter's wire.RAY_SD_PATH: the targets where Ray serves
what runs on the node reports through `ray.util.metrics`, vLLM's engines in an RL run among them (vLLM's
RayPrometheusStatLogger; Ray exports them as ray_vllm_*).

Ray's dashboard on the head writes those targets itself for Prometheus' file discovery, every 5 s, with an
atomic rename: `<session dir>/prom_metrics_service_discovery.json` (ray/_private/metrics_agent.py
`PrometheusServiceDiscoveryWriter`, Ray 2.60), `[{"labels": {"job": "ray"}, "targets": ["ip:port", ...]}]`:
each alive node's `MetricsExportPort`, then the autoscaler's and the dashboard's own. The head exporter reads
that file (no second view of the GCS to keep) and gives each target the labels /sd gives the exporter of the
node at the same address, when there is exactly one: `cluster` always, `node`, `role` and `ray_node_id`
too. Reading it is bounded: a regular file only (a FIFO would block), at most MAX_BYTES."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from exporter import userinput
from exporter.contract import wire

# ~25 bytes a node: 10,000 nodes are 250 KB; a file past this is not Ray's.
MAX_BYTES = 4 << 20
_TARGET = re.compile(wire.TARGET_PATTERN)


class UnreadableFile(Exception):
    """Ray's discovery file is missing, not a regular file, too big or not what Ray writes."""


def read_targets(session_dirs: Iterable[Path]) -> list[str]:
    """The targets of the first session directory that has Ray's discovery file, in Ray's order;
    UnreadableFile when none has one that reads."""
    problems = []
    for session_dir in session_dirs:
        try:
            body, _ = userinput.read_file(session_dir / wire.RAY_SD_FILE, limit=MAX_BYTES)
            return _targets(json.loads(body))
        except (UnreadableFile, ValueError, RecursionError) as exc:  # userinput.InputError is a ValueError
            problems.append(f"{session_dir / wire.RAY_SD_FILE}: {exc}")
    raise UnreadableFile("; ".join(problems) or "no Ray session directory")


def _targets(document: object) -> list[str]:
    if not isinstance(document, list):
        raise UnreadableFile("not a list of target groups")
    found: dict[str, None] = {}  # ordered, each target once
    for group in document:
        targets = group.get("targets") if isinstance(group, dict) else None
        if not isinstance(targets, list):
            raise UnreadableFile("a target group without a list of targets")
        found.update((t, None) for t in targets if isinstance(t, str) and _TARGET.fullmatch(t))
    return list(found)


def _host(target: str) -> str:
    return target.rpartition(":")[0].strip("[]")


def agent_groups(targets: Iterable[str], exporter_groups: Iterable[Mapping[str, Any]],
                 cluster: str) -> list[dict[str, Any]]:
    """One group per metrics agent, labelled as the exporter of the node at its address (when one
    exporter group alone has that address; several Ray nodes on one host share it)."""
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for group in exporter_groups:
        for target in group.get("targets", ()):
            by_host.setdefault(_host(str(target)), []).append(group.get("labels", {}))
    groups = []
    for target in targets:
        same_host = by_host.get(_host(target), [])
        labels = dict(same_host[0]) if len(same_host) == 1 else {}
        groups.append({"targets": [target], "labels": {**labels, "cluster": cluster}})
    return groups
