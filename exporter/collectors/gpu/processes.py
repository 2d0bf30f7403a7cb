"""Processes using each GPU: memory and utilization per process, and the table the Ray collector
reads to attribute GPU use to Ray jobs (published in `Shared.gpu_processes`).

NVML reports host PIDs: in a container the exporter needs the host PID namespace (hostPID /
--pid=host) for these to match anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from exporter.collectors.gpu.families import COLLECTOR, gpu_gauge, gpu_info
from exporter.collectors.gpu.reader import Area, DeviceReader, Sink
from exporter.framework.catalog import gauge
from exporter.framework.shared import UNKNOWN_OWNERS, GpuOwners, GpuProcessUsage

_MAX_NAME = 64
_WITH_PROCESSES = "while a process uses the GPU"
_NO_MIG_UTILIZATION = "while a process uses the GPU; not with MIG enabled"
_NO_INSTANCE = 0xFFFFFFFF


PROCESSES = gpu_gauge("processes", "Processes using the GPU (compute and graphics).")
INFO = gpu_info("process_info", "A process using the GPU; process_name is the executable's base name.",
                ("pid", "process_name"), only_when=_WITH_PROCESSES)
MEMORY_USED = gpu_gauge("process_memory_used_bytes", "Device memory the process holds.", ("pid",), unit="bytes",
                        only_when=_WITH_PROCESSES)
SM_UTILIZATION = gpu_gauge("process_sm_utilization_ratio", "Share of the SMs' time the process used over NVML's "
                           "last sample period.", ("pid",), unit="ratio", only_when=_NO_MIG_UTILIZATION)
UNLISTED = gauge("raypulse_gpu_processes_unlisted", "GPU processes of the node left out of the per-process "
                 "series by gpu.max_process_series (the smallest device memory first).", collector=COLLECTOR,
                 only_when="while NVML is up")
MEMORY_BANDWIDTH_UTILIZATION = gpu_gauge("process_memory_bandwidth_utilization_ratio", "Share of the memory "
                                         "interface's time the process used.", ("pid",), unit="ratio",
                                         only_when=_NO_MIG_UTILIZATION)


def _running(r: DeviceReader) -> dict[int, Any] | None:
    compute = r.call("nvmlDeviceGetComputeRunningProcesses")
    if compute is None:
        return None
    processes = {p.pid: p for p in compute}
    for process in r.call("nvmlDeviceGetGraphicsRunningProcesses") or ():
        processes.setdefault(process.pid, process)
    return processes


def _utilization(r: DeviceReader) -> dict[int, tuple[float, float]] | None:
    """pid -> (SM, memory) ratios from the samples since the last run; None when unsupported."""
    since = r.device.process_timestamp_us
    samples = r.call("nvmlDeviceGetProcessesUtilizationInfo", since, key="nvmlDeviceGetProcessesUtilizationInfo",
                     not_found=[])
    if samples is None and "nvmlDeviceGetProcessesUtilizationInfo" in r.device.unsupported:
        samples = r.call("nvmlDeviceGetProcessUtilization", since, key="nvmlDeviceGetProcessUtilization",
                         not_found=[])  # drivers before R550
    if samples is None:
        return None
    latest: dict[int, Any] = {}
    for sample in samples:
        if sample.pid not in latest or sample.timeStamp > latest[sample.pid].timeStamp:
            latest[sample.pid] = sample
    r.device.process_timestamp_us = max((s.timeStamp for s in samples), default=since)
    return {pid: (s.smUtil / 100, s.memUtil / 100) for pid, s in latest.items()}


def _name(r: DeviceReader, pid: int) -> str:
    names = r.device.process_names
    if pid not in names:
        path = r.system_call("nvmlSystemGetProcessName", pid, key="nvmlSystemGetProcessName")
        names[pid] = os.path.basename(path or "")[:_MAX_NAME]
    return names[pid]


def _read(r: DeviceReader) -> None:
    processes = _running(r)
    if processes is None:
        return
    r.add(PROCESSES, len(processes))
    utilization = _utilization(r) if processes else {}
    names = r.device.process_names
    for pid in [p for p in names if p not in processes]:
        del names[pid]  # exited; a reused pid gets its new name
    for pid, process in sorted(processes.items()):
        sm, memory = (None, None) if utilization is None else utilization.get(pid, (0.0, 0.0))
        instance = getattr(process, "gpuInstanceId", _NO_INSTANCE)
        usage = GpuProcessUsage(pid=pid, gpu=r.device.index, uuid=r.device.uuid,
                                used_memory_bytes=process.usedGpuMemory, sm_utilization=sm,
                                memory_bandwidth_utilization=memory, process_name=_name(r, pid),
                                gpu_instance_id=None if instance in (None, _NO_INSTANCE) else instance)
        r.processes.append(usage)  # its series come from emit(), once every GPU of the node is read


def emit(out: Sink, usages: Iterable[GpuProcessUsage], limit: int, owners: GpuOwners = UNKNOWN_OWNERS) -> None:
    """Per-process series for the `limit` (GPU, process) pairs holding the most device memory on the
    node: a bound for the node, not per GPU, since pids churn series with every restart."""
    ranked = sorted(usages, key=lambda u: (-(u.used_memory_bytes or 0), u.gpu, u.pid))
    for usage in ranked[:limit]:
        labels = {"gpu": usage.gpu, "uuid": usage.uuid, **owners.labels(usage.uuid), "pid": usage.pid}
        out.add(INFO, 1, **labels, process_name=usage.process_name)
        out.add(MEMORY_USED, usage.used_memory_bytes, **labels)
        out.add(SM_UTILIZATION, usage.sm_utilization, **labels)
        out.add(MEMORY_BANDWIDTH_UTILIZATION, usage.memory_bandwidth_utilization, **labels)
    out.add(UNLISTED, max(0, len(ranked) - limit))


AREA = Area("processes", read=_read)
