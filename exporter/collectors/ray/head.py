"""The head role: jobs, nodes, resources, actors, tasks and placement groups of the whole Ray
cluster from the dashboard, and the target groups of every node's exporter, which the exporter
serves at /sd (published in `Shared.service_discovery`).

It runs on every exporter but does nothing unless this exporter's role is head (`--ray-role`,
or auto: a watched raylet here is the head), so only one exporter per cluster asks the dashboard
for cluster-wide data. When the dashboard does not answer, the run emits nothing: the Ray series
go away at once instead of freezing, and come back on the first run after Ray returns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from exporter.collector import AsyncCollector, register
from exporter.collectors.ray import cluster, job_workload, jobs
from exporter.collectors.ray.dashboard import DashboardError, connect
from exporter.collectors.ray.localray import LocalRay, Raylet
from exporter.collectors.ray.process_info import start_time
from exporter.collectors.ray.sd import deployed_ports, target_groups
from exporter.config import ExporterConfig
from exporter.shared import ServiceDiscovery, Shared
from exporter.snapshot import SampleSink
from exporter.wire import DEPLOY_NAMESPACE

NAME = jobs.NAME
_RAY_DOWN = ("unreachable", "timeout")


@register
class RayHeadCollector(AsyncCollector):
    name = NAME
    description = ("Jobs (state, attempts, times, exit code, error type, driver-log silence), nodes, resources, "
                   "actors, tasks and placement groups of the Ray cluster; only on the head node (dashboard "
                   "REST API).")

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self.local = LocalRay(config)
        self.settings = config.ray
        self.cluster = config.cluster or ""
        self.starts = jobs.StartTimes()
        self.workloads = job_workload.WorkloadCache()
        # The last node list stays on /sd while the dashboard is down: the nodes' exporters still answer.
        self._sd_groups: tuple[dict[str, object], ...] = ()

    async def collect(self, out: SampleSink) -> None:
        raylets = await asyncio.to_thread(self.local.raylets)  # a procfs scan: off the event loop
        role = self.local.role(raylets)
        if role != "head":
            self.shared.service_discovery.publish(ServiceDiscovery(role))
            return
        self.shared.service_discovery.publish(ServiceDiscovery(role, self._sd_groups))
        now = time.time()
        async with connect(self.local, raylets) as api:
            try:
                raw_jobs = await api.json("/api/jobs/")
            except DashboardError as exc:
                if exc.kind in _RAY_DOWN:
                    return
                raise
            nodes_reply, status, groups, actors, deployed = await asyncio.gather(
                api.state_list("nodes", detail=True), api.json("/api/cluster_status"),
                api.state_list("placement_groups", detail=True), api.summary("actors"),
                api.state_list("actors", [("ray_namespace", "=", DEPLOY_NAMESPACE), ("state", "=", "ALIVE")]),
                return_exceptions=True)
            all_jobs = [job for job in (jobs.parse_job(raw) for raw in raw_jobs if isinstance(raw, dict))
                        if job is not None] if isinstance(raw_jobs, list) else []
            exported = jobs.select_jobs(all_jobs, now, self.settings.finished_job_retention_seconds,
                                        self.settings.max_finished_jobs)
            failed_reads = await self.workloads.refresh(api, self.workloads.due(exported, now), now)
        for _ in range(failed_reads):
            out.partial_error()
        self.workloads.forget_except({job.job_id for job in exported})
        self.starts.update(exported, now, self._driver_start_reader())

        cluster.emit_jobs_by_state(out, all_jobs)
        jobs.emit(out, exported, self.starts, self._session_dirs(raylets), now)
        pgs_by_job: dict[str, dict[str, int]] = {}
        if self._usable(groups, out):
            cluster.emit_placement_groups(out, groups.items, now)
            pgs_by_job = cluster.placement_groups_by_job(groups.items)
        job_workload.emit(out, exported, self.workloads, pgs_by_job)
        nodes: list[cluster.Node] = []
        if self._usable(nodes_reply, out):
            nodes = [n for n in map(cluster.parse_node, nodes_reply.items) if n is not None]
            cluster.emit_nodes(out, nodes, now, self.settings.finished_job_retention_seconds)
            ports = deployed_ports(deployed.items) if self._usable(deployed, out) else {}
            self._sd_groups = tuple(target_groups(nodes, self.cluster, self.local.exporter_port, ports))
            self.shared.service_discovery.publish(ServiceDiscovery(role, self._sd_groups))
        if self._usable(status, out) and isinstance(status, dict):
            cluster.emit_resources(out, status.get("data") or {}, nodes)
        if self._usable(actors, out):
            cluster.emit_actors(out, actors)

    @staticmethod
    def _usable(part: object, out: SampleSink) -> bool:
        """A part of the run that failed is counted and its families omitted; others still publish."""
        if isinstance(part, DashboardError):
            out.partial_error()
            return False
        if isinstance(part, BaseException):
            raise part
        return True

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
