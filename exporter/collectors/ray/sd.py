"""The target groups the head exporter serves at /sd: Prometheus HTTP service discovery of every
alive Ray node's exporter.

Each node's exporter port comes from its Ray node label wire.NODE_LABEL_EXPORTER_PORT (the
launcher sets it with `ray start --labels`); a node without it is assumed to use the head
exporter's own port (a cluster started by hand, every exporter on the same port), unless
`launcher exporters deploy` placed an exporter there: then the port its Ray actor is named with
(wire.node_actor_name; node labels cannot change once a node runs, so the port travels in the
actor name, which the State API lists over HTTP). One target group per node:

    [{"targets": ["10.0.0.5:9477"],
      "labels": {"cluster": "demo", "node": "10.0.0.5", "role": "worker", "ray_node_id": "ab12..."}}]

Finding the deploy actors among any number of others: the GCS filters actors by job_id and state
only (namespace and class are filtered by the dashboard after the GCS has stopped at 10,000 rows),
so they are looked for by job. Every deploy actor belongs to the Ray job of the `launcher exporters
deploy` run that created the supervisor (the supervisor places the node actors, which take its job),
and those runs are Ray jobs the Jobs API lists with the metadata wire.META_TOOL=exporters,
wire.META_TOOL_ACTION=deploy. One read per such job, filtered by job_id and state=ALIVE in the GCS,
returns a row per node whatever else runs. Those rows are read again only when their count moved, a
node /sd lists has no port from them, or the last read is older than REREAD_SECONDS; otherwise a
read of one row says the count. A finished deploy run that placed nothing is not asked again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.collectors.ray.cluster import Node
from exporter.collectors.ray.dashboard import Cuts, DashboardSession, StateList
from exporter.collectors.ray.jobs import Job
from exporter.contract import wire


def deployed_ports(actors: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Node id -> exporter port, from the alive actors of wire.DEPLOY_NAMESPACE (State API rows)."""
    ports = {}
    for actor in actors:
        if actor.get("ray_namespace", wire.DEPLOY_NAMESPACE) != wire.DEPLOY_NAMESPACE:
            continue
        parsed = wire.parse_node_actor_name(str(actor.get("name") or ""))
        if parsed is not None:
            ports[parsed[0]] = parsed[1]
    return ports


def is_deploy_run(job: Job) -> bool:
    return job.meta(wire.META_TOOL) == "exporters" and job.meta(wire.META_TOOL_ACTION) == "deploy"


REREAD_SECONDS = 60.0


@dataclass(frozen=True)
class _Read:
    count: int
    ports: dict[str, int]
    at: float


class DeployedExporters:
    """Where `launcher exporters deploy` placed exporters: node id -> port, read by deploy run (module docstring)."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._barren: set[str] = set()  # finished deploy runs that own no alive actor
        self._reads: dict[str, _Read] = {}
        self._missing = False  # a node had no port from them: read them again

    def missing(self) -> None:
        """/sd met an alive node without a label or a deployed port: read the rows again next time."""
        self._missing = True

    async def read(self, api: DashboardSession, jobs: Iterable[Job], cuts: Cuts) -> dict[str, int]:
        runs = [job for job in jobs if is_deploy_run(job) and job.job_id and job.job_id not in self._barren]
        ports: dict[str, int] = {}
        for found in await asyncio.gather(*(self._read_run(api, job, cuts) for job in runs)):
            ports.update(found)
        self._missing = False
        self._reads = {job.job_id: self._reads[job.job_id] for job in runs if job.job_id in self._reads}
        return ports

    async def _read_run(self, api: DashboardSession, job: Job, cuts: Cuts) -> dict[str, int]:
        alive = [("job_id", "=", job.job_id), ("state", "=", "ALIVE")]
        kept = self._reads.get(job.job_id)
        now = self._clock()
        if kept is not None and not self._missing and now - kept.at < REREAD_SECONDS:
            counted = await api.count("actors", alive)
            if not counted.source_cut and counted.num_filtered == kept.count:
                return kept.ports
        reply: StateList = cuts.check(await api.state_list("actors", alive), f"alive actors of the deploy run "
                                                                              f"{job.job_id}")
        if not reply.items and job.terminal:
            self._barren.add(job.job_id)
        found = deployed_ports(reply.items)
        if reply.complete:
            self._reads[job.job_id] = _Read(reply.num_filtered, found, now)
        return found


def target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def target_groups(nodes: Iterable[Node], cluster: str, fallback_port: int,
                  deployed: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    groups = []
    deployed = deployed or {}
    for node in sorted((n for n in nodes if n.alive and n.node_ip), key=lambda n: (not n.is_head, n.node_id)):
        port_label = node.labels.get(wire.NODE_LABEL_EXPORTER_PORT, "")
        if port_label.isdigit() and 0 < int(port_label) < 65536:
            port = int(port_label)
        else:
            port = deployed.get(node.node_id, fallback_port)
        groups.append({"targets": [target(node.node_ip, port)],
                       "labels": {"cluster": cluster, "node": node.node_name or node.node_ip,
                                  "role": "head" if node.is_head else "worker", "ray_node_id": node.node_id}})
    return groups
