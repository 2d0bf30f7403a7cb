"""One simulated GPU: identity, and state that evolves with its load and its faults.

Everything follows from the utilization, which follows the target load: clocks, power (capped by a
power brake), temperature (first-order towards a power-dependent target, held above slowdown while
thermal-throttled), energy, PCIe and NVLink byte counters, slow background error counters, and the
cumulative clock-event times. State advances lazily, whenever someone reads it.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import random
import uuid as uuidlib
from dataclasses import dataclass, field

import pynvml

from exporter.gpusim.control import GpuControl
from exporter.gpusim.models import GpuModel

# Bus numbers of the eight GPUs of an HGX H100 board, then made-up ones.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_AMBIENT_C = 28.0
_TEMPERATURE_TAU_S = 20.0
_UTILIZATION_TAU_S = 1.0
_MIN_STEP_S = 0.01
# Traffic at full load: PCIe (host <-> GPU, data loading) and each NVLink's share of its speed.
_PCIE_TX_BPS, _PCIE_RX_BPS = 250e6, 600e6
_NVLINK_SHARE = 0.35
_RAW_OVERHEAD = 1.08
# Background error rates (per second, under load): low enough that a healthy GPU shows ~0/hour.
_CORRECTABLE_PCIE_RATE = 2e-4
_NVLINK_CRC_RATE = 1e-4
# Training pattern when no load is set: busy, then a short dip (eval / checkpoint) every minute.
_PATTERN_PERIOD_S, _PATTERN_DIP_S = 60.0, 8.0

REASON_BITS = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
}


def make_handle(anchor: ctypes.Array) -> object:
    """An opaque NVML handle (a c_nvmlDevice_t pointer) whose address identifies `anchor`."""
    return ctypes.cast(ctypes.c_void_p(ctypes.addressof(anchor)), pynvml.c_nvmlDevice_t)


def handle_key(handle: object) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None


@dataclass
class MigInstance:
    """A MIG GPU instance (with one compute instance) carved out of a simulated GPU."""

    index: int
    profile: str
    slices: int
    memory_bytes: int
    gpu_instance_id: int
    uuid: str
    anchor: ctypes.Array = field(default_factory=lambda: ctypes.create_string_buffer(1))

    @property
    def handle(self) -> object:
        return make_handle(self.anchor)


class SimulatedGpu:
    def __init__(self, index: int, model: GpuModel, seed: str, now: float) -> None:
        self.index = index
        self.model = model
        digest = hashlib.sha256(f"{seed}/{index}".encode()).digest()
        self.uuid = "GPU-" + str(uuidlib.UUID(bytes=digest[:16], version=4))
        self.serial = str(1650000000000 + int.from_bytes(digest[16:20]) % 10**9)
        bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else 0x100 - len(_HGX_BUSES) + index
        self.pci_bus_id = f"00000000:{bus:02X}:00.0"
        self._anchor = ctypes.create_string_buffer(1)
        self.handle = make_handle(self._anchor)
        self._random = random.Random(digest)
        self._phase = self._random.uniform(0, 3)  # GPUs of one job are nearly, not exactly, in step
        self._updated = now
        self._primed = False
        self.utilization = 0.0
        self.power_w = model.idle_power_w
        self.temperature_c = self._temperature_target(model.idle_power_w)
        self.energy_mj = 1e9 * self._random.uniform(1, 50)  # the driver has been up a while
        self.reasons = 0
        self.reason_ns = dict.fromkeys(REASON_BITS, 0.0)
        self.idle_ns = 0.0
        self.pcie_bytes = {"tx": self._random.randrange(1 << 32), "rx": self._random.randrange(1 << 32)}
        self.pcie_correctable = 0.0
        self.pcie_replays = 0.0
        self.nvlink_kib = {d: [0.0] * model.nvlink_links for d in ("tx", "rx")}
        self.nvlink_crc = [0.0] * model.nvlink_links
        self.nvlink_recoveries = [0] * model.nvlink_links
        self.nvlink_packets = {"tx": 0.0, "rx": 0.0}
        self.busy_seconds = 0.0  # integral of utilization: what GPM samples difference
        self.lifetime_sbe = self._random.randrange(0, 4)  # errors from before this driver load
        self._links_down: frozenset[int] = frozenset()
        self.mig: list[MigInstance] = []
        self._mig_profiles: tuple[str, ...] = ()

    # -- dynamics -------------------------------------------------------------------------------

    def target_load(self, faults: GpuControl, default_load: float | None, now: float) -> float:
        if faults.load is not None:
            return faults.load
        if default_load is not None:
            return default_load
        position = (now + self._phase) % _PATTERN_PERIOD_S
        return 0.15 if position > _PATTERN_PERIOD_S - _PATTERN_DIP_S else 0.93

    def advance(self, now: float, faults: GpuControl, default_load: float | None) -> None:
        dt = now - self._updated
        if dt < _MIN_STEP_S and self._primed:
            return  # the calls of one collection run see one state, as they would on a real GPU
        self._updated = now
        model = self.model
        load = self.target_load(faults, default_load, now)
        if not self._primed:  # the GPU was already at work when the exporter started
            self._primed = True
            self.utilization = load
            self.temperature_c = self._temperature_target(
                model.idle_power_w + (0.95 * model.power_limit_w - model.idle_power_w) * load)
        jitter = self._random.uniform(-0.02, 0.02) if load > 0.05 else 0.0
        self.utilization += (load - self.utilization) * (1 - math.exp(-dt / _UTILIZATION_TAU_S))
        self.utilization = min(1.0, max(0.0, self.utilization + jitter * min(dt, 1.0)))
        util = self.utilization

        clock_factor = 0.55 if faults.thermal_throttle else 1.0
        power = model.idle_power_w + (0.95 * model.power_limit_w - model.idle_power_w) * util * clock_factor
        if faults.power_brake:
            power = min(power, 0.35 * model.power_limit_w)
        self.power_w = power
        target = self._temperature_target(power)
        self.temperature_c += (target - self.temperature_c) * (1 - math.exp(-dt / _TEMPERATURE_TAU_S))
        if faults.thermal_throttle:
            slowdown = model.thresholds_c[pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN]
            self.temperature_c = max(self.temperature_c, slowdown + 2.0)
        self.energy_mj += power * dt * 1e3

        self.reasons = self._reasons(util, power, faults)
        dt_ns = dt * 1e9
        for name, bit in REASON_BITS.items():
            if self.reasons & bit:
                self.reason_ns[name] += dt_ns
        self.busy_seconds += util * dt
        self.pcie_bytes["tx"] += int(dt * (_PCIE_TX_BPS * util + 1e5))
        self.pcie_bytes["rx"] += int(dt * (_PCIE_RX_BPS * util + 2e5))
        self.pcie_correctable += dt * _CORRECTABLE_PCIE_RATE * util
        self._advance_nvlink(dt, util, frozenset(faults.nvlink_down))

    def _advance_nvlink(self, dt: float, util: float, down: frozenset[int]) -> None:
        for link in down - self._links_down:
            if link < self.model.nvlink_links:
                self.nvlink_recoveries[link] += 1  # the link tried to recover before giving up
        self._links_down = down
        kib_per_s = _NVLINK_SHARE * util * self.model.nvlink_speed_mbps * 1e6 / 1024
        for link in range(self.model.nvlink_links):
            if link in down:
                continue
            for direction in ("tx", "rx"):
                self.nvlink_kib[direction][link] += kib_per_s * dt
            self.nvlink_crc[link] += dt * _NVLINK_CRC_RATE * util
        packets = sum(self.nvlink_kib["tx"]) / 0.25  # 256-byte packets
        self.nvlink_packets = {"tx": packets, "rx": sum(self.nvlink_kib["rx"]) / 0.25}

    def _reasons(self, util: float, power: float, faults: GpuControl) -> int:
        reasons = 0
        if util < 0.05:
            reasons |= REASON_BITS["gpu_idle"]
        if power >= 0.94 * self.model.power_limit_w:
            reasons |= REASON_BITS["sw_power_cap"]
        if faults.thermal_throttle:
            reasons |= REASON_BITS["sw_thermal_slowdown"] | REASON_BITS["hw_thermal_slowdown"] | REASON_BITS[
                "hw_slowdown"]
        if faults.power_brake:
            reasons |= REASON_BITS["hw_power_brake_slowdown"] | REASON_BITS["hw_slowdown"]
        return reasons

    def _temperature_target(self, power: float) -> float:
        return _AMBIENT_C + 45.0 * power / self.model.power_limit_w

    # -- readings derived from the state ----------------------------------------------------------

    def link_up(self, link: int) -> bool:
        return link not in self._links_down

    def clock_mhz(self, clock: int) -> int:
        maximum = self.model.max_clocks_mhz[clock]
        if clock == pynvml.NVML_CLOCK_MEM:
            return maximum
        if self.reasons & REASON_BITS["gpu_idle"]:
            return min(maximum, self.model.idle_sm_clock_mhz)
        if self.reasons & (REASON_BITS["hw_slowdown"] | REASON_BITS["sw_thermal_slowdown"]):
            return int(maximum * 0.55)
        return maximum

    def memory_used(self, processes_bytes: int | None, default_load: float | None, faults: GpuControl) -> int:
        """Reserved memory plus what the processes hold, or a training job's footprint if none are listed."""
        if processes_bytes is not None:
            allocated = processes_bytes
        else:
            load = faults.load if faults.load is not None else default_load
            allocated = 0 if load == 0 else int(0.72 * self.model.memory_bytes)
        return min(self.model.memory_bytes, self.model.reserved_bytes + allocated)

    def set_mig(self, profiles: list[str]) -> None:
        """Reconfigure MIG instances when the control file changes them (invalid profiles are skipped)."""
        if tuple(profiles) == self._mig_profiles:
            return
        self._mig_profiles = tuple(profiles)
        instances, used = [], 0
        for profile in profiles:
            try:
                slices, memory = self.model.mig_profile(profile)
            except ValueError:
                continue
            if used + slices > self.model.mig_slices:
                continue
            used += slices
            digest = hashlib.sha256(f"{self.uuid}/mig/{len(instances)}/{profile}".encode()).digest()
            instances.append(MigInstance(index=len(instances), profile=profile, slices=slices, memory_bytes=memory,
                                         gpu_instance_id=len(instances) + 1,
                                         uuid="MIG-" + str(uuidlib.UUID(bytes=digest[:16], version=4))))
        self.mig = instances
