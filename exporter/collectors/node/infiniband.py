"""InfiniBand and RoCE ports from /sys/class/infiniband: link state, rate, traffic and errors.

Training collectives (NCCL) run over these ports; symbol errors, link downs and retransmits here
explain throughput drops that GPU metrics cannot.
"""

from __future__ import annotations

import re
from pathlib import Path

from exporter.collectors.files import read_int, read_text
from exporter.config import ExporterConfig
from exporter.framework.catalog import counter, gauge, info
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "infiniband"
_LABELS = ("device", "port")
_ONLY = "on nodes with InfiniBand or RoCE adapters"


def _counter(name: str, help: str, unit: str = ""):
    return counter(f"raypulse_node_infiniband_{name}", help, collector=NAME, labels=_LABELS, unit=unit,
                   only_when=_ONLY)


def _gauge(name: str, help: str):
    return gauge(f"raypulse_node_infiniband_{name}", help, collector=NAME, labels=_LABELS, only_when=_ONLY)


INFO = info("raypulse_node_infiniband_port_info", "Identity of an InfiniBand/RoCE port.", collector=NAME,
            labels=("device", "port", "link_layer", "hca_type", "board_id", "firmware_version"), only_when=_ONLY)
STATE = _gauge("port_state", "Logical port state: 1 down, 2 init, 3 armed, 4 active, 5 active_defer.")
PHYSICAL_STATE = _gauge("port_physical_state",
                        "Physical port state: 1 sleep, 2 polling, 3 disabled, 4 training, 5 link up, "
                        "6 link error recovery, 7 phy test.")
RATE = _gauge("port_rate_bytes_per_second", "Negotiated link rate.")
# counters/<file> -> (family, multiplier). Data counters count 4-byte words (IBTA PortCounters).
_COUNTERS = {
    "port_rcv_data": (_counter("receive_bytes_total", "Bytes received.", "bytes"), 4),
    "port_xmit_data": (_counter("transmit_bytes_total", "Bytes transmitted.", "bytes"), 4),
    "port_rcv_packets": (_counter("receive_packets_total", "Packets received."), 1),
    "port_xmit_packets": (_counter("transmit_packets_total", "Packets transmitted."), 1),
    "symbol_error": (_counter("symbol_errors_total", "Minor link errors detected on the physical lanes."), 1),
    "link_downed": (_counter("link_downed_total", "Times the link went down after failing error recovery."), 1),
    "link_error_recovery": (_counter("link_error_recovery_total", "Successful link error recoveries."), 1),
    "port_rcv_errors": (_counter("receive_errors_total", "Received packets with errors."), 1),
    "port_rcv_remote_physical_errors": (_counter("receive_remote_physical_errors_total",
                                                 "Received packets marked bad by the sender's link."), 1),
    "port_xmit_discards": (_counter("transmit_discards_total", "Outbound packets discarded (port down or "
                                    "congested)."), 1),
    "port_xmit_wait": (_counter("transmit_wait_total", "Ticks the port had data to send but no credits "
                                "(congestion)."), 1),
    "local_link_integrity_errors": (_counter("local_link_integrity_errors_total",
                                             "Times local physical errors exceeded the threshold."), 1),
    "excessive_buffer_overrun_errors": (_counter("excessive_buffer_overrun_errors_total",
                                                 "Consecutive flow-control update periods with overrun."), 1),
}
# RoCE / mlx5 hw_counters worth alerting on, exported under their own names (an allow-list: the
# directory holds dozens of driver-specific files).
HW_COUNTERS = ("out_of_buffer", "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err",
               "implied_nak_seq_err", "duplicate_request", "np_cnp_sent", "np_ecn_marked_roce_packets",
               "rp_cnp_handled", "roce_adp_retrans", "roce_slow_restart")
HW_COUNTER = counter("raypulse_node_infiniband_hw_counter_total",
                     "Adapter hardware counters (retransmits, congestion notifications, sequence errors).",
                     collector=NAME, labels=(*_LABELS, "counter"),
                     only_when="on nodes whose adapters expose hw_counters (mlx5, RoCE)")


def _leading_int(text: str | None) -> int | None:
    """'4: ACTIVE' -> 4."""
    match = re.match(r"\s*(\d+)", text or "")
    return int(match[1]) if match else None


def parse_rate(text: str | None) -> float | None:
    """'200 Gb/sec (4X HDR)' -> bytes per second."""
    match = re.match(r"\s*([\d.]+)\s*Gb/sec", text or "")
    return float(match[1]) * 1e9 / 8 if match else None


@register
class InfinibandCollector(BlockingCollector):
    name = NAME
    description = "InfiniBand/RoCE port state, rate, traffic and error counters (/sys/class/infiniband)."

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._root = config.node.sysfs / "class" / "infiniband"

    def collect(self, out: SampleSink) -> None:
        if not self._root.is_dir():
            return  # no adapters: nothing to report, not an error
        for device_dir in sorted(self._root.iterdir()):
            ports = device_dir / "ports"
            if not ports.is_dir():
                continue
            for port_dir in sorted(ports.iterdir()):
                self._port(device_dir, port_dir, out)

    def _port(self, device_dir: Path, port_dir: Path, out: SampleSink) -> None:
        labels = {"device": device_dir.name, "port": port_dir.name}
        out.add_info(INFO, **labels, link_layer=_strip(read_text(port_dir / "link_layer")),
                     hca_type=_strip(read_text(device_dir / "hca_type")),
                     board_id=_strip(read_text(device_dir / "board_id")),
                     firmware_version=_strip(read_text(device_dir / "fw_ver")))
        out.add(STATE, _leading_int(read_text(port_dir / "state")), **labels)
        out.add(PHYSICAL_STATE, _leading_int(read_text(port_dir / "phys_state")), **labels)
        out.add(RATE, parse_rate(read_text(port_dir / "rate")), **labels)
        for filename, (spec, scale) in _COUNTERS.items():
            value = read_int(port_dir / "counters" / filename)
            out.add(spec, None if value is None else value * scale, **labels)
        for name in HW_COUNTERS:
            out.add(HW_COUNTER, read_int(port_dir / "hw_counters" / name), **labels, counter=name)


def _strip(text: str | None) -> str:
    return (text or "").strip()
