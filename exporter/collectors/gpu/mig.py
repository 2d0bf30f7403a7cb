"""Multi-Instance GPU: the instances carved out of a GPU, their memory and (with GPM) activity.

NVML's coarse utilization is not available with MIG enabled, so GPM per GPU instance is the only
utilization there is for MIG users.
"""

from __future__ import annotations

import pynvml

from exporter.collectors.gpu import gpm
from exporter.collectors.gpu.families import gpu_gauge, gpu_info, unsupported_on
from exporter.collectors.gpu.reader import Area, DeviceReader

_MIG = "while MIG mode is on"
_MIG_GPM = "while MIG mode is on, on Hopper and newer, from the second run on"
_ACTIVITY = (pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
             pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)

MODE = gpu_gauge("mig_mode_enabled", "1 if MIG mode is on, now (current) and after the next GPU reset (pending).",
                 ("state",), only_when=unsupported_on("MIG-capable GPUs, A100 and newer"))
INSTANCE_INFO = gpu_info("mig_instance_info", "A MIG device (a compute instance in a GPU instance); uuid is the "
                         "parent GPU's.", ("mig_uuid", "gpu_instance_id", "compute_instance_id", "profile"),
                         only_when=_MIG)
MEMORY_USED = gpu_gauge("mig_memory_used_bytes", "Memory used in the GPU instance.", ("gpu_instance_id",),
                        unit="bytes", only_when=_MIG)
MEMORY_TOTAL = gpu_gauge("mig_memory_total_bytes", "Memory of the GPU instance.", ("gpu_instance_id",),
                         unit="bytes", only_when=_MIG)
SM_ACTIVE = gpu_gauge("mig_sm_active_ratio", "Share of the instance's SMs busy, averaged over time.",
                      ("gpu_instance_id",), unit="ratio", only_when=_MIG_GPM)
TENSOR_ACTIVE = gpu_gauge("mig_tensor_active_ratio", "Share of time the instance's tensor cores did any work.",
                          ("gpu_instance_id",), unit="ratio", only_when=_MIG_GPM)
DRAM_ACTIVE = gpu_gauge("mig_dram_active_ratio", "Memory bandwidth the instance used, as a share of its maximum.",
                        ("gpu_instance_id",), unit="ratio", only_when=_MIG_GPM)
_ACTIVITY_FAMILIES = dict(zip(_ACTIVITY, (SM_ACTIVE, TENSOR_ACTIVE, DRAM_ACTIVE), strict=True))


def _read(r: DeviceReader) -> None:
    mode = r.call("nvmlDeviceGetMigMode")
    if mode is not None:
        r.add(MODE, mode[0], state="current")
        r.add(MODE, mode[1], state="pending")
    instances: set[int | None] = {None}
    if mode is not None and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
        for index in range(r.call("nvmlDeviceGetMaxMigDeviceCount") or 0):
            _instance(r, index, instances)
    gpm.release(r.nvml, r.device, keep=instances)


def _instance(r: DeviceReader, index: int, seen: set[int | None]) -> None:
    """Report the MIG device at `index`, if any. Memory and activity belong to its GPU instance,
    which its sibling compute instances share: reported once per GPU instance (`seen`)."""
    handle = r.call("nvmlDeviceGetMigDeviceHandleByIndex", index, key="nvmlDeviceGetMigDeviceHandleByIndex",
                    not_found=None)
    if handle is None:
        return None
    uuid = r.call("nvmlDeviceGetUUID", handle=handle, key="mig:nvmlDeviceGetUUID")
    instance = r.call("nvmlDeviceGetGpuInstanceId", handle=handle, key="mig:nvmlDeviceGetGpuInstanceId")
    if uuid is None or instance is None:
        return
    compute = r.call("nvmlDeviceGetComputeInstanceId", handle=handle, key="mig:nvmlDeviceGetComputeInstanceId")
    name = r.call("nvmlDeviceGetName", handle=handle, key="mig:nvmlDeviceGetName") or ""
    r.add(INSTANCE_INFO, 1, mig_uuid=uuid, gpu_instance_id=instance,
          compute_instance_id="" if compute is None else compute, profile=name.rpartition("MIG ")[2])
    if instance in seen:
        return
    seen.add(instance)
    memory = r.call("nvmlDeviceGetMemoryInfo", handle=handle, key="mig:nvmlDeviceGetMemoryInfo")
    if memory is not None:
        r.add(MEMORY_USED, memory.used, gpu_instance_id=instance)
        r.add(MEMORY_TOTAL, memory.total, gpu_instance_id=instance)
    if r.device.gpm_supported:
        values = gpm.sample_metrics(r, instance, _ACTIVITY)
        for metric, spec in _ACTIVITY_FAMILIES.items():
            value = values.get(metric)
            r.add(spec, None if value is None else min(1.0, value / 100), gpu_instance_id=instance)


AREA = Area("mig", read=_read)
