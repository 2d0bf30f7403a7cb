"""A simulated GPU's memory and its health (exporter/collectors/gpu/memory.py and ecc.py read it):
framebuffer and BAR1 use, ECC mode and counters (the control file's injected single- and double-bit
errors), retired pages, row remapping.
"""

from __future__ import annotations

from typing import Any

import pynvml

from exporter.gpusim import models
from exporter.gpusim.nvml.base import NvmlBase, _raise, simulated


class Memory(NvmlBase):
    """Memory use, ECC and row remapping."""

    @simulated(device=True)
    def nvmlDeviceGetMemoryInfo(self, handle: object, version: int | None = None) -> Any:
        gpu, instance = self._target(handle)
        faults = self._faults(gpu)
        if instance is not None:
            total = instance.memory_bytes
            used = int(total * 0.6 * gpu.utilization) + 64 * models.MIB
            reserved = 0
        else:
            processes = sum(p.memory_bytes for p in faults.processes) if faults.processes else None
            total, reserved = gpu.model.memory_bytes, gpu.model.reserved_bytes
            used = gpu.memory_used(processes, self._control.load, faults)
        if not version:
            memory = pynvml.c_nvmlMemory_t()
        else:
            memory = pynvml.c_nvmlMemory_v2_t()
            memory.version = version
            memory.reserved = reserved
        memory.total, memory.used, memory.free = total, used, total - used
        return memory

    @simulated(device=True)
    def nvmlDeviceGetBAR1MemoryInfo(self, handle: object) -> Any:
        gpu = self._gpu(handle)
        memory = pynvml.c_nvmlBAR1Memory_t()
        memory.bar1Total = gpu.model.bar1_bytes
        memory.bar1Used = 34 * models.MIB + int(gpu.utilization * 512 * models.MIB)
        memory.bar1Free = memory.bar1Total - memory.bar1Used
        return memory

    @simulated(device=True)
    def nvmlDeviceGetEccMode(self, handle: object) -> list[int]:
        return [pynvml.NVML_FEATURE_ENABLED, pynvml.NVML_FEATURE_ENABLED]

    @simulated(device=True)
    def nvmlDeviceGetTotalEccErrors(self, handle: object, errorType: int, counterType: int) -> int:
        gpu = self._gpu(handle)
        faults = self._faults(gpu)
        corrected = errorType == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        count = faults.ecc_sbe if corrected else faults.ecc_dbe
        if counterType == pynvml.NVML_AGGREGATE_ECC and corrected:
            count += gpu.lifetime_sbe
        return count

    @simulated(device=True)
    def nvmlDeviceGetMemoryErrorCounter(self, handle: object, errorType: int, counterType: int,
                                        locationType: int) -> int:
        gpu = self._gpu(handle)
        if locationType not in gpu.model.ecc_locations:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if locationType != pynvml.NVML_MEMORY_LOCATION_DEVICE_MEMORY:
            return 0  # injected errors are DRAM errors
        return self.nvmlDeviceGetTotalEccErrors(handle, errorType, counterType)

    @simulated(device=True)
    def nvmlDeviceGetRetiredPages(self, device: object, sourceFilter: int) -> list[int]:
        faults = self._faults(self._gpu(device))
        count = faults.ecc_dbe if sourceFilter == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR else (
            faults.ecc_sbe // 2)
        return [0x1F000 + 0x1000 * n for n in range(count)]

    @simulated(device=True)
    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: object) -> int:
        return int(self._faults(self._gpu(device)).row_remap_pending)

    @simulated(device=True)
    def nvmlDeviceGetRemappedRows(self, device: object) -> tuple[int, int, int, int]:
        faults = self._faults(self._gpu(device))
        return (faults.ecc_sbe // 2, faults.ecc_dbe, int(faults.row_remap_pending), int(faults.row_remap_failed))

    @simulated(device=True)
    def nvmlDeviceGetRowRemapperHistogram(self, device: object) -> Any:
        faults = self._faults(self._gpu(device))
        values = pynvml.c_nvmlRowRemapperHistogramValues()
        used = faults.ecc_dbe + faults.ecc_sbe // 2
        values.max, values.high, values.partial, values.low, values.none = (
            max(0, 640 - used), min(used, 640), 0, 0, 640 if faults.row_remap_failed else 0)
        return values
