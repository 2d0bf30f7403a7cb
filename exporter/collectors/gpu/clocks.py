"""Clock frequencies and why they are held down (clock-event, a.k.a. throttle, reasons)."""

from __future__ import annotations

import pynvml

from exporter.collectors.gpu.families import gpu_counter, gpu_gauge, unsupported_on
from exporter.collectors.gpu.reader import Area, DeviceReader

_CLOCKS = {"graphics": pynvml.NVML_CLOCK_GRAPHICS, "sm": pynvml.NVML_CLOCK_SM, "memory": pynvml.NVML_CLOCK_MEM,
           "video": pynvml.NVML_CLOCK_VIDEO}
REASONS = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clock_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}
# Cumulative nanoseconds a reason held the clocks down (fields; the old per-policy counters for the rest).
_REASON_FIELDS = {
    "sw_power_cap": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
    "sync_boost": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST,
    "sw_thermal_slowdown": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    "hw_thermal_slowdown": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    "hw_power_brake_slowdown": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
}
_POLICY_FIELDS = {
    "thermal": pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL,
    "board_limit": pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT,
    "low_utilization": pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION,
    "reliability": pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY,
    "total_app_clocks": pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS,
    "total_base_clocks": pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS,
}

CLOCK = gpu_gauge("clock_hertz", "Current clock frequency.", ("clock",), unit="hertz")
CLOCK_MAX = gpu_gauge("clock_max_hertz", "Highest clock frequency the GPU supports.", ("clock",), unit="hertz")
EVENT_ACTIVE = gpu_gauge("clock_event_active", "1 while the reason holds the clocks down (sw_power_cap: at the "
                         "power limit; *_thermal_slowdown: too hot; hw_power_brake_slowdown: external power brake).",
                         ("reason",), only_when=unsupported_on("drivers R535 and newer"))
EVENT_SECONDS = gpu_counter("clock_event_seconds_total", "Time the reason held the clocks down.", ("reason",),
                            unit="seconds", only_when=unsupported_on("Ampere and newer, recent drivers"))
VIOLATION_SECONDS = gpu_counter("violation_seconds_total", "Time clocks were held below their target by a "
                                "performance policy.", ("policy",), unit="seconds",
                                only_when=unsupported_on("most datacenter GPUs"))


def _static(r: DeviceReader) -> None:
    for name, clock in _CLOCKS.items():
        maximum = r.call("nvmlDeviceGetMaxClockInfo", clock)
        r.add(CLOCK_MAX, None if maximum is None else maximum * 1e6, clock=name)


def _fields(device: object) -> list[tuple[int, int]]:
    return [(field, 0) for field in (*_REASON_FIELDS.values(), *_POLICY_FIELDS.values())]


def _read(r: DeviceReader) -> None:
    for name, clock in _CLOCKS.items():
        mhz = r.call("nvmlDeviceGetClockInfo", clock)
        r.add(CLOCK, None if mhz is None else mhz * 1e6, clock=name)
    reasons = r.call("nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is not None:
        for name, bit in REASONS.items():
            r.add(EVENT_ACTIVE, bool(reasons & bit), reason=name)
    for name, field in _REASON_FIELDS.items():
        r.add(EVENT_SECONDS, _seconds(r.field_counter(field)), reason=name)
    for name, field in _POLICY_FIELDS.items():
        r.add(VIOLATION_SECONDS, _seconds(r.field_counter(field)), policy=name)


def _seconds(nanoseconds: float | None) -> float | None:
    return None if nanoseconds is None else nanoseconds / 1e9


AREA = Area("clocks", read=_read, static=_static, fields=_fields)
