"""The GPU models the simulator can play: their identity, limits and which NVML calls they support.

Numbers are those a real board reports through nvidia-smi / NVML (memory, clocks, power limits,
temperature thresholds, link counts); support follows the architecture (GPM from Hopper on, row
remapping from Ampere on, page retirement only before it, NVLink5 counters only on Blackwell), so
the collector's "omit what is unsupported" path runs on every model but the newest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pynvml

GIB = 1 << 30
MIB = 1 << 20

# Field IDs (pynvml.NVML_FI_*) by the feature that brings them.
_NVLINK = frozenset({pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
                     pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
                     pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
                     pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, pynvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON,
                     pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                     pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX,
                     pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX})
_NVLINK_AMPERE = frozenset({pynvml.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL})
_NVLINK_PER_LINK = frozenset({pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
                              pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, pynvml.NVML_FI_DEV_NVLINK_GET_STATE})
NVLINK5_ERRORS = {  # field -> the counter the simulator keeps for it
    pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS: "symbol",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS: "effective",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS: "rx",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_REMOTE_ERRORS: "rx_remote",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_GENERAL_ERRORS: "rx_general",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS: "malformed",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS: "buffer_overrun",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS: "local_link_integrity",
    pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS: "tx_discard",
}
_NVLINK5 = frozenset({*NVLINK5_ERRORS, pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_PACKETS,
                      pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_PACKETS,
                      pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS,
                      pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS})
_PCIE_ERRORS = frozenset(range(pynvml.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS,
                               pynvml.NVML_FI_DEV_PCIE_COUNT_LCRC_ERROR + 1))
_BASE_FIELDS = frozenset({pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, pynvml.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER,
                          pynvml.NVML_FI_DEV_ENERGY, *range(pynvml.NVML_FI_DEV_PERF_POLICY_POWER,
                                                            pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS + 1)})
_AMPERE_FIELDS = frozenset({pynvml.NVML_FI_DEV_POWER_AVERAGE, pynvml.NVML_FI_DEV_POWER_INSTANT,
                            pynvml.NVML_FI_DEV_POWER_REQUESTED_LIMIT, pynvml.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER,
                            pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
                            pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
                            pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN})
_HOPPER_FIELDS = frozenset({*_PCIE_ERRORS, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
                            pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION})
_HBM = frozenset({pynvml.NVML_FI_DEV_MEMORY_TEMP})

# Calls (pynvml function names) that a family of boards answers with NOT_SUPPORTED.
_NO_ENCODER = frozenset({"nvmlDeviceGetEncoderUtilization"})
_NO_PAGE_RETIREMENT = frozenset({"nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus"})
_NO_ROW_REMAP = frozenset({"nvmlDeviceGetRemappedRows", "nvmlDeviceGetRowRemapperHistogram"})
_NO_FABRIC = frozenset({"nvmlDeviceGetGpuFabricInfoV"})
_NO_MIG = frozenset({"nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
                     "nvmlGpmMigSampleGet"})
_NO_NVLINK = frozenset({"nvmlDeviceGetNvLinkState"})
_NO_MARGIN = frozenset({"nvmlDeviceGetMarginTemperature"})

_ECC_VOLTA = frozenset({pynvml.NVML_MEMORY_LOCATION_L1_CACHE, pynvml.NVML_MEMORY_LOCATION_L2_CACHE,
                        pynvml.NVML_MEMORY_LOCATION_DEVICE_MEMORY, pynvml.NVML_MEMORY_LOCATION_REGISTER_FILE,
                        pynvml.NVML_MEMORY_LOCATION_TEXTURE_MEMORY})
_ECC_AMPERE = frozenset({pynvml.NVML_MEMORY_LOCATION_DEVICE_MEMORY, pynvml.NVML_MEMORY_LOCATION_SRAM})


@dataclass(frozen=True)
class GpuModel:
    key: str
    name: str
    architecture: int
    compute_capability: tuple[int, int]
    brand: int
    memory_bytes: int
    reserved_bytes: int
    bar1_bytes: int
    max_clocks_mhz: dict[int, int]  # NVML_CLOCK_* -> MHz
    idle_sm_clock_mhz: int
    power_limit_w: float
    power_min_w: float
    idle_power_w: float
    thresholds_c: dict[int, int]  # NVML_TEMPERATURE_THRESHOLD_* -> °C
    pcie_generation: int
    nvlink_links: int = 0
    nvlink_speed_mbps: int = 0
    fans: int = 0
    mig_slices: int = 0  # 0: no MIG
    vbios: str = "96.00.99.00.01"
    fields: frozenset[int] = frozenset()
    unsupported: frozenset[str] = frozenset()
    ecc_locations: frozenset[int] = frozenset()
    gpm: bool = False
    pcie_device_id: int = 0x233010DE

    def supports(self, call: str) -> bool:
        return call not in self.unsupported

    def mig_profile(self, profile: str) -> tuple[int, int]:
        """'3g.40gb' -> (3 compute slices, memory bytes), checked against this board."""
        match = re.fullmatch(r"([1-7])g\.(\d+)gb", profile)
        if not self.mig_slices:
            raise ValueError(f"{self.key} does not support MIG")
        if not match:
            raise ValueError(f"MIG profile {profile!r} is not of the form <slices>g.<memory>gb, e.g. 3g.40gb")
        slices, memory_gb = int(match[1]), int(match[2])
        if memory_gb * 1e9 > self.memory_bytes * 1.1:
            raise ValueError(f"MIG profile {profile!r} asks for more memory than a {self.key} has")
        return slices, memory_gb * 1_000_000_000


def _clocks(graphics: int, sm: int, memory: int, video: int) -> dict[int, int]:
    return {pynvml.NVML_CLOCK_GRAPHICS: graphics, pynvml.NVML_CLOCK_SM: sm, pynvml.NVML_CLOCK_MEM: memory,
            pynvml.NVML_CLOCK_VIDEO: video}


def _thresholds(shutdown: int, slowdown: int, gpu_max: int, memory_max: int | None) -> dict[int, int]:
    values = {pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: shutdown,
              pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: slowdown, pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: gpu_max}
    if memory_max is not None:
        values[pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX] = memory_max
    return values


_HOPPER_ALL_FIELDS = (_BASE_FIELDS | _AMPERE_FIELDS | _HOPPER_FIELDS | _HBM | _NVLINK | _NVLINK_AMPERE
                      | _NVLINK_PER_LINK)
_HOPPER_UNSUPPORTED = _NO_ENCODER | _NO_PAGE_RETIREMENT

H100 = GpuModel(
    key="H100", name="NVIDIA H100 80GB HBM3", architecture=pynvml.NVML_DEVICE_ARCH_HOPPER, compute_capability=(9, 0),
    brand=pynvml.NVML_BRAND_NVIDIA, memory_bytes=81559 * MIB, reserved_bytes=530 * MIB, bar1_bytes=128 * GIB,
    max_clocks_mhz=_clocks(1980, 1980, 2619, 1545), idle_sm_clock_mhz=345, power_limit_w=700, power_min_w=200,
    idle_power_w=72, thresholds_c=_thresholds(92, 89, 87, 95), pcie_generation=5, nvlink_links=18,
    nvlink_speed_mbps=26562, mig_slices=7, fields=_HOPPER_ALL_FIELDS, unsupported=_HOPPER_UNSUPPORTED,
    ecc_locations=_ECC_AMPERE, gpm=True, pcie_device_id=0x233010DE)
H200 = GpuModel(
    key="H200", name="NVIDIA H200", architecture=pynvml.NVML_DEVICE_ARCH_HOPPER, compute_capability=(9, 0),
    brand=pynvml.NVML_BRAND_NVIDIA, memory_bytes=143771 * MIB, reserved_bytes=560 * MIB, bar1_bytes=256 * GIB,
    max_clocks_mhz=_clocks(1980, 1980, 3201, 1545), idle_sm_clock_mhz=345, power_limit_w=700, power_min_w=200,
    idle_power_w=76, thresholds_c=_thresholds(92, 89, 87, 95), pcie_generation=5, nvlink_links=18,
    nvlink_speed_mbps=26562, mig_slices=7, fields=_HOPPER_ALL_FIELDS, unsupported=_HOPPER_UNSUPPORTED,
    ecc_locations=_ECC_AMPERE, gpm=True, pcie_device_id=0x233510DE)
B200 = GpuModel(
    key="B200", name="NVIDIA B200", architecture=pynvml.NVML_DEVICE_ARCH_BLACKWELL, compute_capability=(10, 0),
    brand=pynvml.NVML_BRAND_NVIDIA, memory_bytes=183359 * MIB, reserved_bytes=620 * MIB, bar1_bytes=256 * GIB,
    max_clocks_mhz=_clocks(1965, 1965, 3996, 1770), idle_sm_clock_mhz=420, power_limit_w=1000, power_min_w=400,
    idle_power_w=140, thresholds_c=_thresholds(95, 92, 90, 97), pcie_generation=5, nvlink_links=18,
    nvlink_speed_mbps=53125, mig_slices=7, fields=_HOPPER_ALL_FIELDS | _NVLINK5, unsupported=_HOPPER_UNSUPPORTED,
    ecc_locations=_ECC_AMPERE, gpm=True, pcie_device_id=0x290110DE)
A100 = GpuModel(
    key="A100", name="NVIDIA A100-SXM4-80GB", architecture=pynvml.NVML_DEVICE_ARCH_AMPERE, compute_capability=(8, 0),
    brand=pynvml.NVML_BRAND_NVIDIA, memory_bytes=81920 * MIB, reserved_bytes=480 * MIB, bar1_bytes=128 * GIB,
    max_clocks_mhz=_clocks(1410, 1410, 1593, 1290), idle_sm_clock_mhz=210, power_limit_w=400, power_min_w=100,
    idle_power_w=60, thresholds_c=_thresholds(92, 89, 85, 95), pcie_generation=4, nvlink_links=12,
    nvlink_speed_mbps=25000, mig_slices=7,
    fields=_BASE_FIELDS | _AMPERE_FIELDS | _HBM | _NVLINK | _NVLINK_AMPERE,
    unsupported=_NO_ENCODER | _NO_PAGE_RETIREMENT | _NO_FABRIC, ecc_locations=_ECC_AMPERE, pcie_device_id=0x20B210DE)
V100 = GpuModel(
    key="V100", name="Tesla V100-SXM2-32GB", architecture=pynvml.NVML_DEVICE_ARCH_VOLTA, compute_capability=(7, 0),
    brand=pynvml.NVML_BRAND_TESLA, memory_bytes=32768 * MIB, reserved_bytes=0, bar1_bytes=32 * GIB,
    max_clocks_mhz=_clocks(1530, 1530, 877, 1372), idle_sm_clock_mhz=135, power_limit_w=300, power_min_w=150,
    idle_power_w=42, thresholds_c=_thresholds(90, 87, 83, 95), pcie_generation=3, nvlink_links=6,
    nvlink_speed_mbps=25781, fields=_BASE_FIELDS | _HBM | _NVLINK,
    unsupported=_NO_ROW_REMAP | _NO_FABRIC | _NO_MIG | _NO_MARGIN, ecc_locations=_ECC_VOLTA, pcie_device_id=0x1DB510DE)
RTX6000ADA = GpuModel(
    key="RTX6000ADA", name="NVIDIA RTX 6000 Ada Generation", architecture=pynvml.NVML_DEVICE_ARCH_ADA,
    compute_capability=(8, 9), brand=pynvml.NVML_BRAND_NVIDIA_RTX, memory_bytes=49140 * MIB, reserved_bytes=430 * MIB,
    bar1_bytes=64 * GIB, max_clocks_mhz=_clocks(2505, 2505, 10001, 1965), idle_sm_clock_mhz=210, power_limit_w=300,
    power_min_w=100, idle_power_w=25, thresholds_c=_thresholds(94, 91, 89, None), pcie_generation=4, fans=1,
    fields=_BASE_FIELDS | _AMPERE_FIELDS,
    unsupported=_NO_PAGE_RETIREMENT | _NO_FABRIC | _NO_MIG | _NO_NVLINK, ecc_locations=_ECC_AMPERE,
    pcie_device_id=0x26B110DE)

MODELS: dict[str, GpuModel] = {m.key: m for m in (H100, H200, B200, A100, V100, RTX6000ADA)}
DEFAULT_MODEL = "H100"


def model(key: str) -> GpuModel:
    try:
        return MODELS[key.upper()]
    except KeyError:
        raise ValueError(f"unknown simulated GPU model {key!r}; choose one of {', '.join(MODELS)}") from None
