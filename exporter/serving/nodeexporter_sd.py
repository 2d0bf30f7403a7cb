"""node_exporter's targets in the head exporter's /sd (setting `node_exporter.discover`).

node_exporter's series carry no `cluster` or `node` label, so dashboards could not tell which
Ray node they describe. /sd already gives every node's exporter those labels; with discovery on
it also lists the node_exporter on the same host, with the same labels and its own `job`
(discovery may set `job`: Prometheus keeps it over the scrape job's name, as Ray's own /sd does
with job="ray"). One `http_sd_configs` entry then scrapes both, and the dashboards' node panels
join node_exporter's series to Ray nodes on (`cluster`, `node`).

Several Ray nodes on one host (a local test cluster) list that host's node_exporter once each,
one per `node` label: each node's panels then show its host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from exporter.contract import wire


def _with_port(target: str, port: int) -> str:
    """`10.0.0.5:9477` or `[fd00::5]:9477` with another port."""
    host, _, _ = target.rpartition(":")
    return f"{host}:{port}"


def node_exporter_groups(groups: Iterable[Mapping[str, Any]], port: int, job: str) -> list[dict[str, Any]]:
    """One target group per exporter group: node_exporter on the same host, the same labels, `job` = job."""
    return [{"targets": [_with_port(str(target), port) for target in group.get("targets", ())],
             "labels": {**group.get("labels", {}), wire.SD_JOB_LABEL: job}} for group in groups]
