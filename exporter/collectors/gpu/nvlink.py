"""NVLink: links up or down, traffic, and errors, per link where NVML gives them per link.

Totals over all links come from the fields' all-links scope; NVLink5 (Blackwell) packet counters
are per link in NVML and summed here, since one series per link and error type would be hundreds
per node.
"""

from __future__ import annotations

import pynvml

from exporter.collectors.gpu.families import gpu_counter, gpu_gauge, unsupported_on
from exporter.collectors.gpu.reader import ALL_LINKS, Area, DeviceReader, read_fields

_ONLY = unsupported_on("GPUs with NVLink")
_BYTES = {"tx": pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, "rx": pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX}
_RAW_BYTES = {"tx": pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX, "rx": pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX}
_ERRORS = {"crc_flit": pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
           "crc_data": pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
           "replay": pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
           "recovery": pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
           "ecc_data": pynvml.NVML_FI_DEV_NVLINK_ECC_DATA_ERROR_COUNT_TOTAL}
_LINK_ERRORS = {"replay": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                "recovery": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
                "crc": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC}
_PACKET_ERRORS = {"symbol": pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS,
                  "effective": pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS,
                  "rx": pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS,
                  "rx_remote": pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_REMOTE_ERRORS,
                  "rx_general": pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_GENERAL_ERRORS,
                  "malformed": pynvml.NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS,
                  "buffer_overrun": pynvml.NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS,
                  "local_link_integrity": pynvml.NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS,
                  "tx_discard": pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS}
_RECOVERIES = {"successful": pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS,
               "failed": pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS}
_PACKETS = {"tx": pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_PACKETS, "rx": pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_PACKETS}
_SUMMED = (*_PACKET_ERRORS.values(), *_RECOVERIES.values(), *_PACKETS.values())

LINKS = gpu_gauge("nvlink_links", "NVLink links the GPU has.", only_when=_ONLY)
LINK_UP = gpu_gauge("nvlink_link_up", "1 if the NVLink link is up (active), 0 if it is down.", ("link",),
                    only_when=_ONLY)
LINK_SPEED = gpu_gauge("nvlink_link_speed_bytes_per_second", "Speed of each active NVLink link, per direction.",
                       only_when=_ONLY)
BYTES = gpu_counter("nvlink_bytes_total", "NVLink payload bytes over all links.", ("direction",), unit="bytes",
                    only_when=_ONLY)
RAW_BYTES = gpu_counter("nvlink_raw_bytes_total", "NVLink bytes over all links, protocol overhead included.",
                        ("direction",), unit="bytes", only_when=_ONLY)
ERRORS = gpu_counter("nvlink_errors_total", "NVLink errors over all links: flow-control and data CRC errors, "
                     "replays, recoveries, data ECC errors.", ("type",), only_when=_ONLY)
LINK_ERRORS = gpu_counter("nvlink_link_errors_total", "NVLink data-link errors of one link: CRC errors, replays, "
                          "recoveries.", ("link", "type"), only_when=unsupported_on("Hopper and newer with NVLink"))
PACKET_ERRORS = gpu_counter("nvlink_packet_errors_total", "NVLink5 packet and symbol errors, summed over links.",
                            ("type",), only_when=unsupported_on("Blackwell and newer (NVLink5)"))
RECOVERY_EVENTS = gpu_counter("nvlink_recovery_events_total", "NVLink5 link recoveries by result, summed over "
                              "links.", ("result",), only_when=unsupported_on("Blackwell and newer (NVLink5)"))
PACKETS = gpu_counter("nvlink_packets_total", "NVLink5 packets, summed over links.", ("direction",),
                      only_when=unsupported_on("Blackwell and newer (NVLink5)"))


def _static(r: DeviceReader) -> None:
    readings = read_fields(r.nvml, r.device, [(pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, 0),
                                              (pynvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON, 0)], r.errors)
    count = readings.get((pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, 0))
    speed = readings.get((pynvml.NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON, 0))
    r.device.nvlink_links = int(count.value) if count else 0
    if r.device.nvlink_links:
        r.add(LINKS, r.device.nvlink_links)
        r.add(LINK_SPEED, speed.value * 1e6 if speed else None)


def _fields(device: object) -> list[tuple[int, int]]:
    links = range(getattr(device, "nvlink_links", 0))
    if not links:
        return []
    return [*((f, ALL_LINKS) for f in (*_BYTES.values(), *_RAW_BYTES.values())),
            *((f, 0) for f in _ERRORS.values()),
            *((pynvml.NVML_FI_DEV_NVLINK_GET_STATE, link) for link in links),
            *((f, link) for f in (*_LINK_ERRORS.values(), *_SUMMED) for link in links)]


def _read(r: DeviceReader) -> None:
    links = range(r.device.nvlink_links)
    if not links:
        return
    for link in links:
        r.add(LINK_UP, _link_up(r, link), link=link)
        for name, field in _LINK_ERRORS.items():
            r.add(LINK_ERRORS, r.field_counter(field, link), link=link, type=name)
    for direction in ("tx", "rx"):
        r.add(BYTES, _kib(r.field_counter(_BYTES[direction], ALL_LINKS)), direction=direction)
        r.add(RAW_BYTES, _kib(r.field_counter(_RAW_BYTES[direction], ALL_LINKS)), direction=direction)
        r.add(PACKETS, _summed(r, _PACKETS[direction]), direction=direction)
    for name, field in _ERRORS.items():
        r.add(ERRORS, r.field_counter(field), type=name)
    for name, field in _PACKET_ERRORS.items():
        r.add(PACKET_ERRORS, _summed(r, field), type=name)
    for result, field in _RECOVERIES.items():
        r.add(RECOVERY_EVENTS, _summed(r, field), result=result)


def _link_up(r: DeviceReader, link: int) -> bool | None:
    state = r.field(pynvml.NVML_FI_DEV_NVLINK_GET_STATE, link)
    if state is not None:
        return state == pynvml.NVML_NVLINK_STATE_ACTIVE
    if ("field", pynvml.NVML_FI_DEV_NVLINK_GET_STATE, link) not in r.device.unsupported:
        return None  # failed this run
    active = r.call("nvmlDeviceGetNvLinkState", link)  # drivers without the state field
    return None if active is None else active == pynvml.NVML_FEATURE_ENABLED


def _summed(r: DeviceReader, field: int) -> float | None:
    """A per-link counter summed over links; omitted unless every link answered (a partial sum would
    look like a counter reset)."""
    total = 0.0
    for link in range(r.device.nvlink_links):
        value = r.field_counter(field, link)
        if value is None:
            return None
        total += value
    return total


def _kib(value: float | None) -> float | None:
    return None if value is None else value * 1024


AREA = Area("nvlink", read=_read, static=_static, fields=_fields)
