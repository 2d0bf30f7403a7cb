"""The head role: jobs, nodes, resources, actors, tasks and placement groups of the whole Ray
cluster from the dashboard, and the target groups of every node's exporter, which the exporter
serves at /sd, and of every node's Ray metrics agent, served at /sd/ray (metrics_agents.py; both
published in `Shared.service_discovery`).

It runs on every exporter but does nothing unless this exporter's role is head (`--ray-role`,
or auto: a watched raylet here is the head), so only one exporter per cluster asks the dashboard
for cluster-wide data. When the dashboard does not answer, the run emits nothing: the Ray series
go away at once instead of freezing, and come back on the first run after Ray returns.

What a run reads is bounded by what it keeps, not by the cluster's size: counts come from Ray's
replies to one-row reads and from the GCS's own gauges, rows with detail only where a count cannot
do and only when they changed (cluster.py, job_workload.py, sd.py). A read Ray cuts at its
10,000-row limit is never taken for the whole: what would be built from it is left out, the cut is
counted in raypulse_ray_state_truncations_total and one warning per run says which. Replies are
parsed and samples built off the event loop, so /healthz answers at once during a run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.collectors.ray import cluster, job_workload, jobs, metrics_agents
from exporter.collectors.ray.dashboard import Cuts, DashboardError, StateList, connect
from exporter.collectors.ray.localray import LocalRay, Raylet
from exporter.collectors.ray.process_info import start_time
from exporter.collectors.ray.sd import DeployedExporters, target_groups
from exporter.config import ExporterConfig
from exporter.contract import wire
from exporter.framework.catalog import counter
from exporter.framework.collector import AsyncCollector, register
from exporter.framework.shared import ServiceDiscovery, Shared
from exporter.framework.snapshot import SampleSink

NAME = jobs.NAME
log = logging.getLogger(__name__)
_RAY_DOWN = ("unreachable", "timeout")
STATE_RESOURCES = ("actors", "tasks", "nodes", "placement_groups")

TRUNCATIONS = counter("raypulse_ray_state_truncations_total",
                      "Reads of Ray's State API that came back cut at its 10,000-row limit (fewer rows than "
                      "match), by resource: the series that would be built from them are left out for that run, "
                      "and the exporter logs which reads were cut.", collector=NAME, labels=("resource",),
                      only_when="on the head node")


@dataclass
class _Read:
    """What one run read from the dashboard, for building the samples."""

    now: float
    all_jobs: list[jobs.Job]
    exported: list[jobs.Job]
    nodes: StateList | DashboardError | None = None
    status: Any = None
    groups: cluster.PlacementGroups | DashboardError | None = None
    actors: dict[str, int] | DashboardError | None = None
    deployed: dict[str, int] | DashboardError | None = None


@register
class RayHeadCollector(AsyncCollector):
    name = NAME
    description = ("Jobs (state, attempts, times, exit code, error type, driver-log silence), nodes, resources, "
                   "actors, tasks and placement groups of the Ray cluster; only on the head node (dashboard "
                   "REST API, Ray's metrics agent).")

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self.local = LocalRay(config)
        self.settings = config.ray
        self.cluster = config.cluster or ""
        self.starts = jobs.StartTimes()
        self.workloads = job_workload.WorkloadCache()
        self.deployed = DeployedExporters()
        self.truncations = dict.fromkeys(STATE_RESOURCES, 0)
        self.bytes_read = 0  # by the last run: what the dashboard's replies weighed
        # The last node list stays on /sd while the dashboard is down: the nodes' exporters still answer.
        self._sd_groups: tuple[dict[str, object], ...] = ()
        self._agent_groups: tuple[dict[str, object], ...] = ()  # kept while Ray's file does not read
        self._agents_read = True  # the last read worked: a failure after it is logged once
        self._deployed_ports: dict[str, int] = {}

    async def collect(self, out: SampleSink) -> None:
        raylets = await asyncio.to_thread(self.local.raylets)  # a procfs scan: off the event loop
        role = self.local.role(raylets)
        if role != "head":
            self.shared.service_discovery.publish(ServiceDiscovery(role))
            return
        self.shared.service_discovery.publish(ServiceDiscovery(role, self._sd_groups, self._agent_groups))
        now = time.time()
        cuts = Cuts()
        async with connect(self.local, raylets) as api:
            try:
                raw_jobs = await api.json("/api/jobs/")
            except DashboardError as exc:
                if exc.kind in _RAY_DOWN:
                    return
                raise
            all_jobs = await asyncio.to_thread(_parse_jobs, raw_jobs)
            exported = jobs.select_jobs(all_jobs, now, self.settings.finished_job_retention_seconds,
                                        self.settings.max_finished_jobs)
            read = _Read(now, all_jobs, exported)
            results = await asyncio.gather(
                api.state_list("nodes", detail=True), api.json("/api/cluster_status"),
                cluster.read_placement_groups(api, cuts),
                cluster.actors_by_state(api, self.local.head_metrics_url(raylets), cuts),
                self.deployed.read(api, all_jobs, cuts),
                return_exceptions=True)
            read.nodes, read.status, read.groups, read.actors, read.deployed = results
            failed_reads = await self.workloads.refresh(api, self.workloads.due(exported, now), now, cuts)
            self.bytes_read = api.bytes_read
        for _ in range(failed_reads):
            out.partial_error()
        self.workloads.forget_except({job.job_id for job in exported})
        self.starts.update(exported, now, self._driver_start_reader())
        # Building tens of thousands of samples is CPU work: a thread, so the loop keeps answering.
        await asyncio.to_thread(self._emit, out, read, cuts, self._session_dirs(raylets))

    def _emit(self, out: SampleSink, read: _Read, cuts: Cuts, session_dirs: list[Path]) -> None:
        cluster.emit_jobs_by_state(out, read.all_jobs)
        jobs.emit(out, read.exported, self.starts, session_dirs, read.now)
        pgs_by_job: dict[str, dict[str, int]] = {}
        if self._usable(read.groups, out):
            assert isinstance(read.groups, cluster.PlacementGroups)
            if read.groups.groups.complete:
                cluster.emit_placement_group_states(out, read.groups.groups.items)
                pgs_by_job = cluster.placement_groups_by_job(read.groups.groups.items)
            if all(reply.complete for reply in read.groups.waiting):
                cluster.emit_oldest_pending(out, (row for reply in read.groups.waiting for row in reply.items),
                                            read.now)
        job_workload.emit(out, read.exported, self.workloads, pgs_by_job)
        if self._usable(read.deployed, out):
            assert isinstance(read.deployed, dict)
            self._deployed_ports = read.deployed
        nodes: list[cluster.Node] = []
        if self._usable(read.nodes, out):
            assert isinstance(read.nodes, StateList)
            nodes = [n for n in map(cluster.parse_node, read.nodes.items) if n is not None]
            if cuts.check(read.nodes, "nodes").complete:
                cluster.emit_nodes(out, nodes, read.now, self.settings.finished_job_retention_seconds)
            self._sd_groups = tuple(target_groups(nodes, self.cluster, self.local.exporter_port,
                                                  self._deployed_ports))
            if self._deployed_ports and any(n.alive and n.node_id not in self._deployed_ports
                                            and wire.NODE_LABEL_EXPORTER_PORT not in n.labels for n in nodes):
                self.deployed.missing()  # a node joined since the deploy actors were read
        if self.settings.discover_metrics_agents:
            self._read_metrics_agents(session_dirs)
        self.shared.service_discovery.publish(ServiceDiscovery("head", self._sd_groups, self._agent_groups))
        if self._usable(read.status, out) and isinstance(read.status, dict):
            cluster.emit_resources(out, read.status.get("data") or {}, nodes)
        if self._usable(read.actors, out):
            assert isinstance(read.actors, dict)
            cluster.emit_actors(out, read.actors)
        for resource, count in cuts.by_resource.items():
            self.truncations[resource] = self.truncations.get(resource, 0) + count
        for resource, total in self.truncations.items():
            out.add(TRUNCATIONS, total, resource=resource)
        cuts.warn()

    def _read_metrics_agents(self, session_dirs: list[Path]) -> None:
        try:
            targets = metrics_agents.read_targets(session_dirs)
        except metrics_agents.UnreadableFile as exc:
            if self._agents_read:
                log.warning("Ray's metrics agents are not listed at %s: %s (Ray's dashboard writes that file on "
                            "the head; set ray.discover_metrics_agents: false to stop looking)", wire.RAY_SD_PATH, exc)
            self._agents_read = False
            return
        self._agents_read = True
        self._agent_groups = tuple(metrics_agents.agent_groups(targets, self._sd_groups, self.cluster))

    @staticmethod
    def _usable(part: object, out: SampleSink) -> bool:
        """A part of the run that failed is counted and its families omitted; others still publish."""
        if isinstance(part, DashboardError):
            out.partial_error()
            return False
        if isinstance(part, BaseException):
            raise part
        return part is not None

    def _driver_start_reader(self) -> Callable[[jobs.Job], float | None]:
        """Reads a driver's process start time when the driver runs on this host (any raylet here)."""
        local_nodes = {raylet.node_id for raylet in self.local.host_raylets()}

        def driver_start(job: jobs.Job) -> float | None:
            if job.driver_pid and job.driver_node_id in local_nodes:
                return start_time(self.local.procfs, job.driver_pid)
            return None

        return driver_start

    def _session_dirs(self, raylets: list[Raylet]) -> list[Path]:
        dirs = [r.session_dir for r in raylets if r.session_dir is not None]
        return dirs or [self.config.node.ray_temp_dir / "session_latest"]


def _parse_jobs(raw: object) -> list[jobs.Job]:
    if not isinstance(raw, list):
        return []
    return [job for job in (jobs.parse_job(item) for item in raw if isinstance(item, dict)) if job is not None]
