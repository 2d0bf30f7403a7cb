"""The pod / container cgroup: CPU use and throttling, memory against its limit, OOM kills,
pids, I/O and pressure, plus who the pod is (Kubernetes downward API or cgroup path)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from exporter.collectors.files import read_text
from exporter.collectors.pod.cgroup import CgroupLocation, CgroupStats, locate, read_stats
from exporter.collectors.psi import PressureFamilies
from exporter.config import ExporterConfig
from exporter.framework.catalog import counter, gauge, info
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "pod"
_LIMITED = "only when the cgroup has a limit"
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _gauge(name: str, help: str, unit: str = "", only_when: str | None = None):
    return gauge(f"raypulse_pod_{name}", help, collector=NAME, unit=unit, only_when=only_when)


def _counter(name: str, help: str, unit: str = "", only_when: str | None = None):
    return counter(f"raypulse_pod_{name}", help, collector=NAME, unit=unit, only_when=only_when)


INFO = info("raypulse_pod_info", "Identity of the measured pod or container and its cgroup.", collector=NAME,
            labels=("pod", "namespace", "pod_uid", "container_id", "node_name", "cgroup_version", "cgroup_path"))
# CgroupStats attribute -> family
_FAMILIES = {
    "cpu_usage_seconds": _counter("cpu_usage_seconds_total", "CPU time used by the cgroup.", "seconds"),
    "cpu_user_seconds": _counter("cpu_user_seconds_total", "CPU time used in user mode.", "seconds"),
    "cpu_system_seconds": _counter("cpu_system_seconds_total", "CPU time used in kernel mode.", "seconds"),
    "cpu_periods": _counter("cpu_periods_total", "CFS enforcement periods elapsed.",
                            only_when="when the cpu controller enforces periods"),
    "cpu_throttled_periods": _counter("cpu_throttled_periods_total", "CFS periods in which the cgroup was "
                                      "throttled.", only_when="when the cpu controller enforces periods"),
    "cpu_throttled_seconds": _counter("cpu_throttled_seconds_total", "Time the cgroup was throttled by its CPU "
                                      "limit.", "seconds", only_when="when the cpu controller enforces periods"),
    "cpu_limit_cpus": _gauge("cpu_limit", "CPU limit in CPUs (quota / period).", only_when=_LIMITED),
    "memory_usage_bytes": _gauge("memory_usage_bytes", "Memory charged to the cgroup, page cache included.",
                                 "bytes"),
    "memory_limit_bytes": _gauge("memory_limit_bytes", "Memory limit.", "bytes", only_when=_LIMITED),
    "memory_working_set_bytes": _gauge("memory_working_set_bytes", "Usage minus inactive page cache: what the "
                                       "kubelet and the OOM killer look at.", "bytes"),
    "memory_anonymous_bytes": _gauge("memory_anonymous_bytes", "Anonymous memory (heaps, stacks).", "bytes"),
    "memory_file_bytes": _gauge("memory_file_bytes", "Page cache charged to the cgroup.", "bytes"),
    "memory_peak_bytes": _gauge("memory_peak_bytes", "Highest memory usage recorded.", "bytes",
                                only_when="on cgroup v1, or v2 with kernel 5.19+"),
    "memory_swap_bytes": _gauge("memory_swap_bytes", "Swap used by the cgroup.", "bytes",
                                only_when="when swap accounting is on"),
    "memory_oom_kills": _counter("memory_oom_kills_total", "Processes of the cgroup killed by the OOM killer.",
                                 only_when="on kernels 4.13 and newer"),
    "memory_limit_hits": _counter("memory_limit_hits_total", "Times usage hit the memory limit (reclaim or OOM "
                                  "followed)."),
    "pids": _gauge("pids", "Tasks in the cgroup.", only_when="when the pids controller is enabled for it"),
    "pids_limit": _gauge("pids_limit", "Most tasks the cgroup may hold.", only_when=_LIMITED),
    "io_read_bytes": _counter("io_read_bytes_total", "Bytes the cgroup read from block devices.", "bytes",
                              only_when="when the io/blkio controller is enabled for it"),
    "io_written_bytes": _counter("io_written_bytes_total", "Bytes the cgroup wrote to block devices.", "bytes",
                                 only_when="when the io/blkio controller is enabled for it"),
}
_PSI = "on cgroup v2 (or a hybrid host's unified mount) with pressure stall information"
POD_PRESSURE = PressureFamilies.declare("pod", "the cgroup's", NAME, _PSI)


def pod_identity(environ: Mapping[str, str], location: CgroupLocation, node_name: str | None) -> dict[str, str]:
    """Downward API variables first (POD_NAME, POD_NAMESPACE, POD_UID, NODE_NAME), then what the
    cgroup path and the service account mount tell."""
    in_kubernetes = "KUBERNETES_SERVICE_HOST" in environ
    namespace = environ.get("POD_NAMESPACE") or (
        (read_text(_SERVICE_ACCOUNT_NAMESPACE) or "").strip() if in_kubernetes else "")
    return {
        "pod": environ.get("POD_NAME") or (environ.get("HOSTNAME", "") if in_kubernetes else ""),
        "namespace": namespace,
        "pod_uid": environ.get("POD_UID") or location.pod_uid,
        "container_id": location.container_id,
        "node_name": environ.get("NODE_NAME") or node_name or "",
        "cgroup_version": str(location.version),
        "cgroup_path": location.path,
    }


@register
class PodCollector(BlockingCollector):
    name = NAME
    description = ("The pod/container cgroup: CPU use, throttling and limit, memory against its limit, OOM "
                   "kills, pids, I/O, pressure; pod identity (cgroup v1 and v2).")

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._settings = config.pod
        self._procfs = config.node.procfs
        self._node_name = config.node.name
        self._location: CgroupLocation | None = None

    def location(self) -> CgroupLocation:
        if self._location is None:
            own = read_text(self._procfs / "self" / "cgroup")
            if own is None:
                raise FileNotFoundError(self._procfs / "self" / "cgroup")
            self._location = locate(self._settings.cgroupfs, own, self._settings.cgroup_path)
        return self._location

    def collect(self, out: SampleSink) -> None:
        location = self.location()
        stats: CgroupStats = read_stats(location)
        out.add_info(INFO, **pod_identity(os.environ, location, self._node_name))
        for attribute, spec in _FAMILIES.items():
            out.add(spec, getattr(stats, attribute))
        for resource, totals in stats.pressure.items():
            POD_PRESSURE.add(out, resource, totals)
