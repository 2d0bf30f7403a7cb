"""Is Ray there? The dashboard and GCS as this node sees them, Ray's version, and which raylets
this exporter watches (`raypulse_ray_node_info` joins a scrape target to its Ray node id).

Ray being down is not a collector failure: the run succeeds, `raypulse_ray_up` says 0, and the
other Ray collectors omit their series, so nothing stale is served and recovery needs no restart.
"""

from __future__ import annotations

import asyncio
import time

from exporter.collectors.ray.dashboard import ERROR_KINDS, DashboardError, connect
from exporter.collectors.ray.localray import LocalRay
from exporter.config import ExporterConfig
from exporter.framework.catalog import counter, gauge, info
from exporter.framework.collector import AsyncCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "ray"
_UP = "while the Ray dashboard answers"
_RAYLET = "while a watched raylet runs on this host"

UP = gauge("raypulse_ray_up", "1 if the Ray dashboard answered and reports the GCS healthy, else 0.",
           collector=NAME)
INFO = info("raypulse_ray_info", "Ray version and session of the cluster this exporter talks to.",
            collector=NAME, labels=("ray_version", "ray_commit", "session_name"), only_when=_UP)
PROBE_DURATION = gauge("raypulse_ray_dashboard_request_duration_seconds",
                       "How long the last health probe of the Ray dashboard took.", collector=NAME,
                       unit="seconds", only_when=_UP)
ERRORS = counter("raypulse_ray_dashboard_errors_total",
                 "Failed health probes of the Ray dashboard by kind: unreachable, timeout, unauthorized (token "
                 "missing or wrong), http (another error status), invalid (an unexpected reply).",
                 collector=NAME, labels=("kind",))
RAYLETS = gauge("raypulse_ray_local_raylets", "Raylets on this host that this exporter watches (0: no Ray "
                "node here, or it died).", collector=NAME)
NODE_INFO = info("raypulse_ray_node_info", "A Ray node this exporter watches: its id, address, role and cluster "
                 "(the same facts /sd puts on targets as ray_node_id, role and cluster).",
                 collector=NAME, labels=("cluster_name", "node_id", "node_ip", "node_role"), only_when=_RAYLET)


@register
class RayHealthCollector(AsyncCollector):
    name = NAME
    description = ("Whether the Ray dashboard and GCS answer, Ray's version, and the raylets on this host "
                   "(dashboard REST API, procfs).")

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self.local = LocalRay(config)
        self.cluster = config.cluster or ""
        self.errors = dict.fromkeys(ERROR_KINDS, 0)

    async def collect(self, out: SampleSink) -> None:
        raylets = await asyncio.to_thread(self.local.raylets)  # a procfs scan: off the event loop
        out.add(RAYLETS, len(raylets))
        for raylet in raylets:
            out.add_info(NODE_INFO, cluster_name=self.cluster, node_id=raylet.node_id, node_ip=raylet.node_ip,
                         node_role="head" if raylet.is_head else "worker")
        started = time.monotonic()
        try:
            async with connect(self.local, raylets) as api:
                version, gcs = await asyncio.gather(api.json("/api/version"), api.text("/api/gcs_healthz"))
        except DashboardError as exc:
            self.errors[exc.kind] += 1
            out.add(UP, 0)
        else:
            healthy = gcs.strip() == "success" and isinstance(version, dict)
            out.add(UP, healthy)
            if healthy:
                out.add(PROBE_DURATION, time.monotonic() - started)
                out.add_info(INFO, ray_version=version.get("ray_version", ""), ray_commit=version.get("ray_commit", ""),
                             session_name=version.get("session_name", ""))
        for kind, count in self.errors.items():
            out.add(ERRORS, count, kind=kind)
