"""The PCIe link: negotiated generation and width against their maxima (a downtrained link), traffic,
replays and errors."""

from __future__ import annotations

import pynvml

from exporter.collectors.gpu.families import gpu_counter, gpu_gauge, unsupported_on
from exporter.collectors.gpu.reader import Area, DeviceReader

_BYTES = {"tx": pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, "rx": pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES}
_ERRORS = {
    "correctable": pynvml.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS,
    "nak_received": pynvml.NVML_FI_DEV_PCIE_COUNT_NAKS_RECEIVED,
    "receiver_error": pynvml.NVML_FI_DEV_PCIE_COUNT_RECEIVER_ERROR,
    "bad_tlp": pynvml.NVML_FI_DEV_PCIE_COUNT_BAD_TLP,
    "nak_sent": pynvml.NVML_FI_DEV_PCIE_COUNT_NAKS_SENT,
    "bad_dllp": pynvml.NVML_FI_DEV_PCIE_COUNT_BAD_DLLP,
    "non_fatal": pynvml.NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR,
    "fatal": pynvml.NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR,
    "unsupported_request": pynvml.NVML_FI_DEV_PCIE_COUNT_UNSUPPORTED_REQ,
    "lcrc": pynvml.NVML_FI_DEV_PCIE_COUNT_LCRC_ERROR,
}

GENERATION = gpu_gauge("pcie_link_generation", "PCIe generation the link runs at now (links may train down "
                       "when idle).")
MAX_GENERATION = gpu_gauge("pcie_link_max_generation", "Highest PCIe generation the GPU and its slot support.")
WIDTH = gpu_gauge("pcie_link_width", "PCIe lanes the link runs with now.")
MAX_WIDTH = gpu_gauge("pcie_link_max_width", "Most PCIe lanes the GPU and its slot support.")
BYTES = gpu_counter("pcie_bytes_total", "Bytes over PCIe, protocol headers included (tx: from the GPU).",
                    ("direction",), unit="bytes", only_when=unsupported_on("Hopper and newer"))
REPLAYS = gpu_counter("pcie_replays_total", "PCIe replays: packets sent again after a link error.")
REPLAY_ROLLOVERS = gpu_counter("pcie_replay_rollovers_total", "Times the hardware PCIe replay counter rolled over.",
                               only_when=unsupported_on("most datacenter GPUs"))
ERRORS = gpu_counter("pcie_errors_total", "PCIe errors by type.", ("type",),
                     only_when=unsupported_on("Hopper and newer"))
L0_TO_RECOVERY = gpu_counter("pcie_l0_to_recovery_total", "Times the link left L0 to retrain (recovery).",
                             only_when=unsupported_on("Ampere and newer"))


def _static(r: DeviceReader) -> None:
    r.add(MAX_GENERATION, r.call("nvmlDeviceGetMaxPcieLinkGeneration"))
    r.add(MAX_WIDTH, r.call("nvmlDeviceGetMaxPcieLinkWidth"))


def _fields(device: object) -> list[tuple[int, int]]:
    return [(field, 0) for field in (*_BYTES.values(), *_ERRORS.values(), pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
                                     pynvml.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER,
                                     pynvml.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER)]


def _read(r: DeviceReader) -> None:
    r.add(GENERATION, r.call("nvmlDeviceGetCurrPcieLinkGeneration"))
    r.add(WIDTH, r.call("nvmlDeviceGetCurrPcieLinkWidth"))
    for direction, field in _BYTES.items():
        r.add(BYTES, r.field_counter(field), direction=direction)
    r.add(REPLAYS, r.field_or_call_counter(pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, "nvmlDeviceGetPcieReplayCounter",
                                           32))
    r.add(REPLAY_ROLLOVERS, r.field_counter(pynvml.NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER))
    for name, field in _ERRORS.items():
        r.add(ERRORS, r.field_counter(field), type=name)
    r.add(L0_TO_RECOVERY, r.field_counter(pynvml.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER))


AREA = Area("pcie", read=_read, static=_static, fields=_fields)
