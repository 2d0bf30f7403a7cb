"""`nvmlDeviceGetFieldValues` over a simulated GPU (exporter/collectors/gpu/reader.py's read_fields
asks for it): one table of every field's value at one instant (NVLink, PCIe, power, energy, memory
temperature, recovery action, perf policy). A field the model lacks, or that the control file marks
not supported, answers NOT_SUPPORTED.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, ClassVar

import pynvml

from exporter.gpusim import models
from exporter.gpusim.control import GpuControl
from exporter.gpusim.device import SimulatedGpu
from exporter.gpusim.nvml.base import _UINT_MAX, NvmlBase, simulated
from exporter.gpusim.nvml.nvlink import _per_link_value

_VALUE_MEMBERS = {pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal", pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal"}


class Fields(NvmlBase):
    """Field values."""

    @simulated(device=True)
    def nvmlDeviceGetFieldValues(self, handle: object, fieldIds: list[int | tuple[int, int]]) -> Any:
        gpu = self._gpu(handle)
        faults = self._faults(gpu)
        unsupported = set(self._control.not_supported) | set(faults.not_supported)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        table = _FieldTable(gpu, faults)
        now_us = self._now_us()
        set_ = ctypes.Structure.__setattr__  # numbers only: skip pynvml's str-conversion hook
        for i, field_id in enumerate(fieldIds):
            fid, scope = field_id if isinstance(field_id, tuple) else (field_id, 0)
            value = values[i]
            set_(value, "fieldId", fid)
            set_(value, "scopeId", scope)
            set_(value, "timestamp", now_us)
            if fid not in gpu.model.fields or _field_names(fid) & unsupported:
                set_(value, "nvmlReturn", pynvml.NVML_ERROR_NOT_SUPPORTED)
                continue
            reading = table.value(fid, scope)
            if reading is None:
                set_(value, "nvmlReturn", pynvml.NVML_ERROR_INVALID_ARGUMENT)
                continue
            value_type, number = reading
            set_(value, "valueType", value_type)
            setattr(ctypes.Structure.__getattribute__(value, "value"), _VALUE_MEMBERS.get(value_type, "ullVal"),
                    number)
            set_(value, "nvmlReturn", pynvml.NVML_SUCCESS)
        return values


@functools.cache
def _field_names(field_id: int) -> frozenset[str]:
    """Every pynvml name of a field ID (some have two, e.g. PERF_POLICY_POWER and ..._SW_POWER_CAP)."""
    return frozenset(name for name in dir(pynvml)
                     if name.startswith("NVML_FI_") and name != "NVML_FI_MAX" and getattr(pynvml, name) == field_id)


class _FieldTable:
    """The values of every field for one GPU at one instant, built once per nvmlDeviceGetFieldValues."""

    _PER_LINK = frozenset({pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                           pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
                           *models.NVLINK5_ERRORS, pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_PACKETS,
                           pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_PACKETS,
                           pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS,
                           pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS})
    _THROUGHPUT: ClassVar[dict[int, tuple[str, float]]] = {pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: ("tx", 1.0),
                   pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: ("rx", 1.0),
                   pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: ("tx", 1.08),
                   pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: ("rx", 1.08)}

    def __init__(self, gpu: SimulatedGpu, faults: GpuControl) -> None:
        self.gpu = gpu
        ull, ui = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        reasons, crc = gpu.reason_ns, sum(gpu.nvlink_crc)
        self.simple: dict[int, tuple[int, float]] = {
            pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: (ull, int(crc)),
            pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: (ull, int(crc * 0.1)),
            pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: (ull, int(crc * 0.3)),
            pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: (ull, sum(gpu.nvlink_recoveries)),
            pynvml.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL: (ull, 0),
            pynvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON: (ui, gpu.model.nvlink_speed_mbps),
            pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: (ui, gpu.model.nvlink_links),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (ui, int(gpu.pcie_replays)),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER: (ui, 0),
            pynvml.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER: (ui, int(gpu.pcie_correctable / 2)),
            pynvml.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS: (ui, int(gpu.pcie_correctable)),
            pynvml.NVML_FI_DEV_POWER_AVERAGE: (ui, round(gpu.power_w * 1000)),
            pynvml.NVML_FI_DEV_POWER_INSTANT: (ui, round(gpu.power_w * 1000 * (1 + 0.04 * (gpu.utilization - 0.5)))),
            pynvml.NVML_FI_DEV_POWER_REQUESTED_LIMIT: (ui, round(gpu.model.power_limit_w * 1000)),
            pynvml.NVML_FI_DEV_ENERGY: (ull, int(gpu.energy_mj)),
            # The simulator reports the PCIe byte counters as 32-bit values, so they wrap within
            # minutes under load and the collector's unwrapping is exercised.
            pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (ui, gpu.pcie_bytes["tx"] & _UINT_MAX),
            pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (ui, gpu.pcie_bytes["rx"] & _UINT_MAX),
            pynvml.NVML_FI_DEV_MEMORY_TEMP: (ui, round(gpu.temperature_c + 6)),
            pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: (ui, faults.recovery_action),
            pynvml.NVML_FI_DEV_PERF_POLICY_POWER: (ull, int(reasons["sw_power_cap"])),
            pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: (ull, int(reasons["sw_thermal_slowdown"]
                                                              + reasons["hw_thermal_slowdown"])),
            pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: (ull, 0),
            pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: (ull, 0),
            pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: (ull, int(reasons["gpu_idle"])),
            pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY: (ull, 0),
            pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS: (ull, int(sum(reasons.values()) - reasons["gpu_idle"])),
            pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS: (ull, int(reasons["hw_slowdown"])),
            pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: (ull, int(reasons["sw_thermal_slowdown"])),
            pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: (ull, int(reasons["hw_thermal_slowdown"])),
            pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: (
                ull, int(reasons["hw_power_brake_slowdown"])),
        }
        for fid in range(pynvml.NVML_FI_DEV_PCIE_COUNT_NAKS_RECEIVED, pynvml.NVML_FI_DEV_PCIE_COUNT_LCRC_ERROR + 1):
            self.simple[fid] = (ui, 0)  # uncorrectable PCIe errors: none on a healthy link

    def value(self, fid: int, scope: int) -> tuple[int, float] | None:
        """(value type, value) of one field, or None for a scope the field does not have."""
        gpu, links = self.gpu, self.gpu.model.nvlink_links
        if fid in self._PER_LINK:
            if not 0 <= scope < links:
                return None
            return _per_link_value(gpu, fid, scope)
        if fid in self._THROUGHPUT:
            direction, factor = self._THROUGHPUT[fid]
            per_link_kib = gpu.nvlink_kib[direction]
            if scope == _UINT_MAX:
                return pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, int(sum(per_link_kib) * factor)
            if not 0 <= scope < links:
                return None
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, int(per_link_kib[scope] * factor)
        return self.simple.get(fid)
