"""The Ray cluster as the head sees it: nodes (alive, dead and why), logical resources (capacity,
use, pending demand), actors and placement groups by state, and jobs by state.

Sources: `/api/v0/nodes`, `/api/v0/placement_groups` (State API), `/api/cluster_status` (the
autoscaler's load report) and Ray's metrics agent on the head node. The load report camel-cases
every key (`object_store_memory` -> `objectStoreMemory`); resource names are mapped back through
the names the node list reports, with Ray's own conversion.

Actors by state need no list: the GCS keeps the count itself and exports it as `ray_actors`
(Source="gcs", by State and class Name) on the head's metrics agent, exact at any number of actors
(its DEAD counts every actor that died since the GCS started). Without that endpoint, each state is
counted through the State API with a server-side state filter and one row read; a state the GCS
stopped counting at its 10,000-row limit is derived from the total when it is the only one, else
left out. The actor summary (`/api/v0/actors/summarize`) is not used: it summarises one list of at
most 10,000 actors.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.ray.dashboard import INLINE_JSON_BYTES, Cuts, DashboardError, DashboardSession, StateList
from exporter.collectors.ray.jobs import NAME, STATES, Job, enum_value
from exporter.collectors.ray.localray import warn_once
from exporter.framework.catalog import gauge
from exporter.framework.snapshot import SampleSink

_HEAD = "on the head node while the Ray dashboard answers"
NODE_STATES = ("ALIVE", "DEAD")
ACTOR_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD")
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
ACTORS = _gauge("actors", "Actors of the whole cluster by state, Ray's own included (DEPENDENCIES_UNREADY, "
                "PENDING_CREATION, ALIVE, RESTARTING, DEAD): the GCS's own count (Ray's ray_actors gauge, whose "
                "DEAD is every actor that died since the GCS started), else the State API's.", ("state",))
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
    """By state and the oldest waiting one, from rows with detail."""
    groups = list(groups)
    emit_placement_group_states(out, groups)
    emit_oldest_pending(out, groups, now)


def emit_placement_group_states(out: SampleSink, groups: Iterable[Mapping[str, Any]]) -> None:
    states = Counter(enum_value(group.get("state")) for group in groups)
    for state in {*PLACEMENT_GROUP_STATES, *states}:
        out.add(PLACEMENT_GROUPS, states[state], state=state)


def emit_oldest_pending(out: SampleSink, groups: Iterable[Mapping[str, Any]], now: float) -> None:
    """The age of the oldest group still waiting (PENDING, RESCHEDULING), from rows with detail (stats)."""
    oldest = 0.0
    for group in groups:
        if enum_value(group.get("state")) in ("PENDING", "RESCHEDULING"):
            stats = group.get("stats") if isinstance(group.get("stats"), dict) else {}
            received = float(stats.get("creation_request_received_ns") or 0) / 1e9  # type: ignore[union-attr]
            if received:
                oldest = max(oldest, now - received)
    out.add(OLDEST_PENDING_PG, oldest)


def parse_ray_actors(text: str) -> dict[str, int] | None:
    """Actors by state from a metrics agent's exposition: `ray_actors{Source="gcs"}` summed over classes;
    None when the exposition has none (no actors yet, or not the head's agent)."""
    lines = [line for line in text.splitlines()
             if line.startswith(("ray_actors{", "ray_actors ", "# HELP ray_actors ", "# TYPE ray_actors "))]
    states: Counter[str] = Counter()
    seen = False
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name == "ray_actors" and sample.labels.get("Source") == "gcs":
                states[enum_value(sample.labels.get("State"))] += sample.value
                seen = True
    return {state: int(count) for state, count in states.items()} if seen else None


async def actors_by_state(api: DashboardSession, metrics_url: str | None, cuts: Cuts) -> dict[str, int]:
    """The cluster's actors by state, every state whose count is exact (module docstring)."""
    if metrics_url:
        try:
            text = await api.metrics_text(metrics_url)
            parsed = await asyncio.to_thread(parse_ray_actors, text) if len(text) > INLINE_JSON_BYTES \
                else parse_ray_actors(text)
        except DashboardError as exc:
            warn_once(("metrics", metrics_url, exc.kind), "Ray's metrics agent at %s did not answer (%s): "
                      "counting actors through the State API instead", metrics_url, exc)
            parsed = None
        if parsed is not None:
            return {**dict.fromkeys(ACTOR_STATES, 0), **parsed}
    replies = await asyncio.gather(*(api.count("actors", [("state", "=", state)]) for state in ACTOR_STATES))
    exact = {state: reply.num_filtered for state, reply in zip(ACTOR_STATES, replies, strict=True)
             if not reply.source_cut}
    cut = [(state, reply) for state, reply in zip(ACTOR_STATES, replies, strict=True) if reply.source_cut]
    if len(cut) == 1:  # the one state the GCS stopped counting is what the others leave of its total
        exact[cut[0][0]] = max(0, cut[0][1].total - sum(exact.values()))
    else:
        for state, reply in cut:
            cuts.add("actors", f"actors in state {state}: the GCS stopped after {reply.num_filtered:,} of them")
    return exact


def emit_actors(out: SampleSink, states: Mapping[str, int]) -> None:
    for state, count in states.items():
        out.add(ACTORS, count, state=state)


@dataclass(frozen=True)
class PlacementGroups:
    groups: StateList  # every group, without detail (id, job, state)
    waiting: list[StateList]  # PENDING and RESCHEDULING ones with detail (their creation time)


async def read_placement_groups(api: DashboardSession, cuts: Cuts) -> PlacementGroups:
    """All groups by state without detail, and with detail only those still waiting, when there are
    some (bundles and stats are most of a group's row)."""
    groups = cuts.check(await api.state_list("placement_groups"), "placement groups")
    present = {enum_value(group.get("state")) for group in groups.items}
    waiting = [state for state in ("PENDING", "RESCHEDULING") if state in present or not groups.complete]
    replies = await asyncio.gather(*(api.state_list("placement_groups", [("state", "=", state)], detail=True)
                                     for state in waiting))
    for state, reply in zip(waiting, replies, strict=True):
        cuts.check(reply, f"{state} placement groups")
    return PlacementGroups(groups, list(replies))


def emit_jobs_by_state(out: SampleSink, jobs: Iterable[Job]) -> None:
    states = Counter(job.status for job in jobs)
    for state in STATES:
        out.add(JOBS, states[state], state=state)
