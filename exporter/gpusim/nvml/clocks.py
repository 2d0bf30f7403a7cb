"""A simulated GPU's clocks, temperatures and power (exporter/collectors/gpu/clocks.py, thermal.py
and power.py read it): clocks and clock event reasons (thermal and power throttling), temperatures,
thresholds and fans, power draw, energy and limits.
"""

from __future__ import annotations

import pynvml

from exporter.gpusim.nvml.base import NvmlBase, _raise, simulated


class Clocks(NvmlBase):
    """Clocks, thermal and power."""

    @simulated(device=True)
    def nvmlDeviceGetClockInfo(self, handle: object, type: int) -> int:
        return self._gpu(handle).clock_mhz(type)

    @simulated(device=True)
    def nvmlDeviceGetMaxClockInfo(self, handle: object, type: int) -> int:
        return self._gpu(handle).model.max_clocks_mhz[type]

    @simulated(device=True)
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object) -> int:
        return self._gpu(handle).reasons

    @simulated(device=True)
    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
        return round(self._gpu(handle).temperature_c)

    @simulated(device=True)
    def nvmlDeviceGetTemperatureV(self, handle: object, sensor: int, version: int = pynvml.nvmlTemperature_v1) -> int:
        if version != pynvml.nvmlTemperature_v1:
            _raise(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return round(self._gpu(handle).temperature_c)

    @simulated(device=True)
    def nvmlDeviceGetTemperatureThreshold(self, handle: object, threshold: int) -> int:
        thresholds = self._gpu(handle).model.thresholds_c
        if threshold not in thresholds:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return thresholds[threshold]

    @simulated(device=True)
    def nvmlDeviceGetMarginTemperature(self, handle: object) -> int:
        gpu = self._gpu(handle)
        return round(gpu.model.thresholds_c[pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN] - gpu.temperature_c)

    @simulated(device=True)
    def nvmlDeviceGetNumFans(self, device: object) -> int:
        return self._gpu(device).model.fans

    @simulated(device=True)
    def nvmlDeviceGetFanSpeed_v2(self, handle: object, fan: int) -> int:
        gpu = self._gpu(handle)
        if fan >= gpu.model.fans:
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED if not gpu.model.fans else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(30 + 0.7 * max(0.0, gpu.temperature_c - 30))

    @simulated(device=True)
    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
        return round(self._gpu(handle).power_w * 1000)

    @simulated(device=True)
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:
        return int(self._gpu(handle).energy_mj)

    @simulated(device=True)
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: object) -> int:
        return round(self._gpu(handle).model.power_limit_w * 1000)

    @simulated(device=True)
    def nvmlDeviceGetPowerManagementLimit(self, handle: object) -> int:
        return round(self._gpu(handle).model.power_limit_w * 1000)

    @simulated(device=True)
    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: object) -> int:
        return round(self._gpu(handle).model.power_limit_w * 1000)

    @simulated(device=True)
    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: object) -> list[int]:
        model = self._gpu(handle).model
        return [round(model.power_min_w * 1000), round(model.power_limit_w * 1000)]
