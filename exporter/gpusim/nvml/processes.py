"""The processes on a simulated GPU (exporter/collectors/gpu/processes.py reads them): the control
file's processes with their memory, MIG instance and utilization samples.
"""

from __future__ import annotations

from typing import Any

import pynvml

from exporter.gpusim.nvml.base import _UINT_MAX, NvmlBase, _raise, simulated


class Processes(NvmlBase):
    """Running processes and their utilization."""

    def _processes(self, handle: object) -> list[Any]:
        gpu = self._gpu(handle)
        processes = []
        for n, process in enumerate(self._faults(gpu).processes):
            info = pynvml.c_nvmlProcessInfo_v3_t()
            info.pid, info.usedGpuMemory = process.pid, process.memory_bytes
            instance = gpu.mig[n % len(gpu.mig)] if gpu.mig else None
            info.gpuInstanceId = instance.gpu_instance_id if instance else _UINT_MAX
            info.computeInstanceId = 0 if instance else _UINT_MAX
            processes.append(pynvml.nvmlStructToFriendlyObject(info))
        return processes

    @simulated(device=True)
    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Any]:
        return self._processes(handle)

    @simulated(device=True)
    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: object) -> list[Any]:
        return []

    def _utilization_samples(self, handle: object, timeStamp: int) -> list[tuple[int, int, int]]:
        gpu = self._gpu(handle)
        processes = self._faults(gpu).processes
        if gpu.mig:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        now_us = self._now_us()
        if not processes or now_us <= timeStamp:
            _raise(pynvml.NVML_ERROR_NOT_FOUND)  # no samples since timeStamp
        even_share = gpu.utilization / len(processes)
        return [(p.pid, round(100 * (p.sm_utilization if p.sm_utilization is not None else even_share)),
                 round(45 * even_share)) for p in processes]

    @simulated(device=True)
    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: object, timeStamp: int) -> list[Any]:
        samples = self._utilization_samples(handle, timeStamp)
        array = (pynvml.c_nvmlProcessUtilizationInfo_v1_t * len(samples))()
        for entry, (pid, sm, memory) in zip(array, samples, strict=True):
            entry.timeStamp, entry.pid, entry.smUtil, entry.memUtil = self._now_us(), pid, sm, memory
        return array[0:len(samples)]

    @simulated(device=True)
    def nvmlDeviceGetProcessUtilization(self, handle: object, timeStamp: int) -> list[Any]:
        samples = self._utilization_samples(handle, timeStamp)
        array = (pynvml.c_nvmlProcessUtilizationSample_t * len(samples))()
        for entry, (pid, sm, memory) in zip(array, samples, strict=True):
            entry.timeStamp, entry.pid, entry.smUtil, entry.memUtil = self._now_us(), pid, sm, memory
        return array[0:len(samples)]
