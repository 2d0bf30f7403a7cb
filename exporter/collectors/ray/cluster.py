"""The Ray cluster as the head sees it: nodes (alive, dead and why), logical resources (capacity,
use, pending demand), actors and placement groups by state, and jobs by state.

Sources: `/api/v0/nodes`, `/api/v0/placement_groups`, `/api/v0/actors/summarize` (State API) and
`/api/cluster_status` (the autoscaler's load report). The latter camel-cases every key
(`object_store_memory` -> `objectStoreMemory`); resource names are mapped back through the
names the node list reports, with Ray's own conversion.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.catalog import gauge
from exporter.collectors.ray.jobs import NAME, STATES, Job, enum_value
from exporter.snapshot import SampleSink

_HEAD = "on the head node while the Ray dashboard answers"
NODE_STATES = ("ALIVE", "DEAD")
PLACEMENT_GROUP_STATES = ("PENDING", "PREPARED", "CREATED", "REMOVED", "RESCHEDULING")
# dashboard/utils.py compose_state_message, inverted: the state message starts with these.
_DEATH_MESSAGES = {"Expected termination": "EXPECTED_TERMINATION", "Unexpected termination": "UNEXPECTED_TERMINATION",
                   "Terminated due to preemption": "AUTOSCALER_DRAIN_PREEMPTED",
                   "Terminated due to idle": "AUTOSCALER_DRAIN_IDLE"}


def _gauge(name: str, help: str, labels: tuple[str, ...] = (), unit: str = "", only_when: str = _HEAD):
    return gauge(f"raypulse_ray_{name}", help, collector=NAME, labels=labels, unit=unit, only_when=only_when)


NODES = _gauge("nodes", "Ray nodes by state (ALIVE, DEAD) in the GCS node table.", ("state",))
NODE_DEATHS = _gauge("node_deaths", "Dead Ray nodes by cause (EXPECTED_TERMINATION, UNEXPECTED_TERMINATION, "
                     "AUTOSCALER_DRAIN_PREEMPTED, AUTOSCALER_DRAIN_IDLE, UNSPECIFIED).", ("reason",))
NODE_ALIVE = _gauge("node_alive", "1 while the Ray node is alive; 0 for a node that died within the finished-job "
                    "retention window.", ("node_id", "node_ip", "node_role"))
NODE_START = _gauge("node_start_time_seconds", "Unix time the Ray node registered.", ("node_id",), "seconds")
NODE_END = _gauge("node_end_time_seconds", "Unix time the Ray node died.", ("node_id",), "seconds",
                  only_when="for nodes that died within the retention window")
NODE_DEATH = _gauge("node_death_reason", "1 for the cause of a dead node's death.", ("node_id", "reason"),
                    only_when="for nodes that died within the retention window")
CAPACITY = _gauge("resource_capacity", "Logical resources of the cluster by name, in the resource's own unit "
                  "(CPUs, GPUs, bytes for memory and object_store_memory).", ("resource",))
USED = _gauge("resource_used", "Logical resources in use by tasks, actors and placement groups.", ("resource",))
NODE_CAPACITY = _gauge("node_resource_capacity", "Logical resources of a Ray node.", ("node_id", "resource"))
NODE_USED = _gauge("node_resource_used", "Logical resources of a Ray node in use.", ("node_id", "resource"))
DEMAND = _gauge("resource_demand", "Resources asked for by tasks, actors and placement groups that wait to be "
                "scheduled (what the autoscaler would add).", ("resource",))
ACTORS = _gauge("actors", "Actors of the whole cluster by state, Ray's own included.", ("state",))
PLACEMENT_GROUPS = _gauge("placement_groups", "Placement groups by state (PENDING, PREPARED, CREATED, REMOVED, "
                          "RESCHEDULING).", ("state",))
OLDEST_PENDING_PG = _gauge("placement_group_oldest_pending_seconds", "Age of the oldest placement group still "
                           "waiting for resources (0 when none waits).", unit="seconds")
JOBS = _gauge("jobs", "Jobs Ray knows by state, finished ones of any age included.", ("state",))


def to_camel_case(name: str) -> str:
    """Ray's dashboard/utils.py to_camel_case, to map load-report keys back to resource names."""
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


def is_reported_resource(name: str) -> bool:
    """Per-node marker resources (node:<ip>, node:__internal_head__) say nothing about capacity."""
    return not name.startswith("node:")


@dataclass(frozen=True)
class Node:
    node_id: str
    node_ip: str
    node_name: str
    is_head: bool
    alive: bool
    death_reason: str
    start_time: float | None
    end_time: float | None
    labels: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, float] = field(default_factory=dict)


def death_reason(message: object) -> str:
    text = str(message or "")
    for prefix, reason in _DEATH_MESSAGES.items():
        if text.startswith(prefix):
            return reason
    return "UNSPECIFIED"


def parse_node(raw: Mapping[str, Any]) -> Node | None:
    node_id = str(raw.get("node_id") or "")
    if not node_id:
        return None
    alive = raw.get("state") == "ALIVE"
    start, end = raw.get("start_time_ms") or 0, raw.get("end_time_ms") or 0
    labels = raw.get("labels") if isinstance(raw.get("labels"), dict) else {}
    resources = raw.get("resources_total") if isinstance(raw.get("resources_total"), dict) else {}
    return Node(node_id=node_id, node_ip=str(raw.get("node_ip") or ""), node_name=str(raw.get("node_name") or ""),
                is_head=bool(raw.get("is_head_node")), alive=alive,
                death_reason="" if alive else death_reason(raw.get("state_message")),
                start_time=start / 1000 if start else None, end_time=end / 1000 if end else None,
                labels={str(k): str(v) for k, v in labels.items()},  # type: ignore[union-attr]
                resources={str(k): float(v) for k, v in resources.items()})  # type: ignore[union-attr]


def emit_nodes(out: SampleSink, nodes: Iterable[Node], now: float, retention_seconds: float) -> None:
    nodes = list(nodes)
    states = Counter("ALIVE" if n.alive else "DEAD" for n in nodes)
    for state in NODE_STATES:
        out.add(NODES, states[state], state=state)
    for reason, count in Counter(n.death_reason for n in nodes if not n.alive).items():
        out.add(NODE_DEATHS, count, reason=reason)
    for node in nodes:
        if not node.alive and (node.end_time is None or now - node.end_time > retention_seconds):
            continue
        out.add(NODE_ALIVE, node.alive, node_id=node.node_id, node_ip=node.node_ip,
                node_role="head" if node.is_head else "worker")
        out.add(NODE_START, node.start_time, node_id=node.node_id)
        if not node.alive:
            out.add(NODE_END, node.end_time, node_id=node.node_id)
            out.add(NODE_DEATH, 1, node_id=node.node_id, reason=node.death_reason)


def _usage(report: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, tuple[float, float]]:
    """{"objectStoreMemory": [used, total]} -> {"object_store_memory": (used, total)}."""
    usage = {}
    for key, pair in report.items():
        name = names.get(key, key)
        if is_reported_resource(name) and isinstance(pair, list) and len(pair) == 2:
            usage[name] = (float(pair[0]), float(pair[1]))
    return usage


def _add_shape(demand: Counter[str], shape: object, count: object, names: Mapping[str, str]) -> None:
    if isinstance(shape, dict) and isinstance(count, (int, float)):
        for key, amount in shape.items():
            if isinstance(amount, (int, float)):
                demand[names.get(key, key)] += amount * count


def emit_resources(out: SampleSink, status: Mapping[str, Any], nodes: Iterable[Node]) -> None:
    """From `/api/cluster_status` data: capacity and use, cluster-wide and per node, and pending demand."""
    names: dict[str, str] = {}
    for node in nodes:
        for resource in node.resources:
            names[to_camel_case(resource)] = resource
    report = (status.get("clusterStatus") or {}).get("loadMetricsReport") or {}
    for resource, (used, total) in _usage(report.get("usage") or {}, names).items():
        out.add(CAPACITY, total, resource=resource)
        out.add(USED, used, resource=resource)
    for node_id, usage in (report.get("usageByNode") or {}).items():
        for resource, (used, total) in _usage(usage, names).items():
            out.add(NODE_CAPACITY, total, node_id=node_id, resource=resource)
            out.add(NODE_USED, used, node_id=node_id, resource=resource)
    demand: Counter[str] = Counter()
    for entry in report.get("resourceDemand") or []:
        if isinstance(entry, list) and len(entry) == 2:
            _add_shape(demand, entry[0], entry[1], names)
    for entry in report.get("pgDemand") or []:
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], dict):
            for bundle in entry[0].get("bundles") or []:
                if isinstance(bundle, list) and len(bundle) == 2 and isinstance(entry[1], (int, float)):
                    _add_shape(demand, bundle[0], bundle[1] * entry[1], names)
    for resource in {*demand, "CPU", "GPU"}:
        if is_reported_resource(resource):
            out.add(DEMAND, demand.get(resource, 0), resource=resource)


def placement_groups_by_job(groups: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    by_job: dict[str, Counter[str]] = {}
    for group in groups:
        by_job.setdefault(str(group.get("creator_job_id") or ""), Counter())[enum_value(group.get("state"))] += 1
    return {job_id: dict(states) for job_id, states in by_job.items()}


def emit_placement_groups(out: SampleSink, groups: Iterable[Mapping[str, Any]], now: float) -> None:
    states: Counter[str] = Counter()
    oldest = 0.0
    for group in groups:
        state = enum_value(group.get("state"))
        states[state] += 1
        if state in ("PENDING", "RESCHEDULING"):
            stats = group.get("stats") if isinstance(group.get("stats"), dict) else {}
            received = float(stats.get("creation_request_received_ns") or 0) / 1e9  # type: ignore[union-attr]
            if received:
                oldest = max(oldest, now - received)
    for state in {*PLACEMENT_GROUP_STATES, *states}:
        out.add(PLACEMENT_GROUPS, states[state], state=state)
    out.add(OLDEST_PENDING_PG, oldest)


def emit_actors(out: SampleSink, summary: Mapping[str, Mapping[str, Any]]) -> None:
    states: Counter[str] = Counter()
    for entry in summary.values():
        for state, count in (entry.get("state_counts") or {}).items():
            states[enum_value(state)] += int(count)
    for state in {"ALIVE", "DEAD", *states}:
        out.add(ACTORS, states[state], state=state)


def emit_jobs_by_state(out: SampleSink, jobs: Iterable[Job]) -> None:
    states = Counter(job.status for job in jobs)
    for state in STATES:
        out.add(JOBS, states[state], state=state)
