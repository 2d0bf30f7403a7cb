"""Power draw, energy, and the limits power is held to."""

from __future__ import annotations

import pynvml

from exporter.collectors.gpu.families import gpu_counter, gpu_gauge, unsupported_on
from exporter.collectors.gpu.reader import Area, DeviceReader

USAGE = gpu_gauge("power_usage_watts", "Power draw (averaged over one second on Ampere and newer, instantaneous "
                  "on older GPUs), as nvidia-smi shows it.", unit="watts")
INSTANT = gpu_gauge("power_instant_watts", "Instantaneous power draw.", unit="watts",
                    only_when=unsupported_on("Ampere and newer"))
ENERGY = gpu_counter("energy_joules_total", "Energy used since the driver was loaded.", unit="joules",
                     only_when=unsupported_on("Volta and newer"))
LIMIT = gpu_gauge("power_limit_watts", "Power limit the GPU is held to now (the lowest of all limits in force).",
                  unit="watts")
LIMIT_BOUND = gpu_gauge("power_limit_bound_watts", "Bounds of the power limit: the lowest and highest an "
                        "administrator may set, the default, and the one last requested.", ("bound",),
                        unit="watts")


def _watts(milliwatts: float | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1e3


def _static(r: DeviceReader) -> None:
    constraints = r.call("nvmlDeviceGetPowerManagementLimitConstraints")
    if constraints is not None:
        r.add(LIMIT_BOUND, _watts(constraints[0]), bound="min")
        r.add(LIMIT_BOUND, _watts(constraints[1]), bound="max")
    r.add(LIMIT_BOUND, _watts(r.call("nvmlDeviceGetPowerManagementDefaultLimit")), bound="default")


def _read(r: DeviceReader) -> None:
    r.add(USAGE, _watts(r.call("nvmlDeviceGetPowerUsage")))
    r.add(INSTANT, _watts(r.field(pynvml.NVML_FI_DEV_POWER_INSTANT)))
    energy = r.field_or_call_counter(pynvml.NVML_FI_DEV_ENERGY, "nvmlDeviceGetTotalEnergyConsumption", 64)
    r.add(ENERGY, None if energy is None else energy / 1e3)
    r.add(LIMIT, _watts(r.call("nvmlDeviceGetEnforcedPowerLimit")))
    r.add(LIMIT_BOUND, _watts(r.field(pynvml.NVML_FI_DEV_POWER_REQUESTED_LIMIT)), bound="requested")


AREA = Area("power", read=_read, static=_static,
            fields=lambda device: [(pynvml.NVML_FI_DEV_POWER_INSTANT, 0), (pynvml.NVML_FI_DEV_ENERGY, 0),
                                   (pynvml.NVML_FI_DEV_POWER_REQUESTED_LIMIT, 0)])
