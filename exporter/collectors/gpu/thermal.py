"""Temperatures, the thresholds at which the GPU slows down or shuts off, and fans."""

from __future__ import annotations

import pynvml

from exporter.collectors.gpu.families import gpu_gauge, unsupported_on
from exporter.collectors.gpu.reader import Area, DeviceReader

_THRESHOLDS = {"shutdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
               "slowdown": pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
               "gpu_max": pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX,
               "memory_max": pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX}

TEMPERATURE = gpu_gauge("temperature_celsius", "Temperature of the GPU die (sensor gpu) or of its HBM memory "
                        "(sensor memory, HBM GPUs only).", ("sensor",), unit="celsius")
THRESHOLD = gpu_gauge("temperature_threshold_celsius", "Temperature at which the GPU slows down, shuts down, or "
                      "leaves its operating range (gpu_max, memory_max).", ("threshold",), unit="celsius")
MARGIN = gpu_gauge("thermal_margin_celsius", "Degrees left before the GPU starts slowing down.", unit="celsius",
                   only_when=unsupported_on("drivers R535 and newer"))
FAN_SPEED = gpu_gauge("fan_speed_ratio", "Fan speed as a share of its maximum.", ("fan",), unit="ratio",
                      only_when="on GPUs with their own fans (not SXM/passively cooled boards)")


def _static(r: DeviceReader) -> None:
    for name, threshold in _THRESHOLDS.items():
        r.add(THRESHOLD, r.call("nvmlDeviceGetTemperatureThreshold", threshold), threshold=name)
    r.device.fans = r.call("nvmlDeviceGetNumFans") or 0


def _read(r: DeviceReader) -> None:
    temperature = r.call("nvmlDeviceGetTemperatureV", pynvml.NVML_TEMPERATURE_GPU)
    if temperature is None and ("nvmlDeviceGetTemperatureV", (pynvml.NVML_TEMPERATURE_GPU,)) in r.device.unsupported:
        temperature = r.call("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU)  # drivers before R550
    r.add(TEMPERATURE, temperature, sensor="gpu")
    r.add(TEMPERATURE, r.field(pynvml.NVML_FI_DEV_MEMORY_TEMP), sensor="memory")
    r.add(MARGIN, r.call("nvmlDeviceGetMarginTemperature"))
    for fan in range(r.device.fans):
        speed = r.call("nvmlDeviceGetFanSpeed_v2", fan)
        r.add(FAN_SPEED, None if speed is None else speed / 100, fan=fan)


AREA = Area("thermal", read=_read, static=_static, fields=lambda device: [(pynvml.NVML_FI_DEV_MEMORY_TEMP, 0)])
