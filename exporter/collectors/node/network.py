"""Network interfaces: traffic and errors from /proc/net/dev, link state from /sys/class/net."""

from __future__ import annotations

import re

from exporter.collectors.files import read_int, read_text
from exporter.config import ExporterConfig
from exporter.framework.catalog import counter, gauge, info
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "network"
_LABELS = ("interface",)


def _counter(name: str, help: str, unit: str = ""):
    return counter(f"raypulse_node_network_{name}", help, collector=NAME, labels=_LABELS, unit=unit)


# /proc/net/dev columns after the interface name -> family
_COLUMNS = {
    0: _counter("receive_bytes_total", "Bytes received.", "bytes"),
    1: _counter("receive_packets_total", "Packets received."),
    2: _counter("receive_errors_total", "Receive errors."),
    3: _counter("receive_drops_total", "Received packets dropped."),
    8: _counter("transmit_bytes_total", "Bytes transmitted.", "bytes"),
    9: _counter("transmit_packets_total", "Packets transmitted."),
    10: _counter("transmit_errors_total", "Transmit errors."),
    11: _counter("transmit_drops_total", "Packets dropped on transmit."),
}
UP = gauge("raypulse_node_network_up", "1 if the interface's operational state is up.", collector=NAME,
           labels=_LABELS)
MTU = gauge("raypulse_node_network_mtu_bytes", "Maximum transmission unit.", collector=NAME, labels=_LABELS,
            unit="bytes")
SPEED = gauge("raypulse_node_network_speed_bytes_per_second", "Negotiated link speed.", collector=NAME,
              labels=_LABELS, only_when="for interfaces that report a link speed (not virtual ones)")
CARRIER_CHANGES = _counter("carrier_changes_total", "Times the link went up or down (flapping).")
INFO = info("raypulse_node_network_info", "Identity of a network interface.", collector=NAME,
            labels=("interface", "address", "operstate", "duplex"))


@register
class NetworkCollector(BlockingCollector):
    name = NAME
    description = "Network interface traffic, errors, drops and link state (/proc/net/dev, /sys/class/net)."

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._dev = config.node.procfs / "net" / "dev"
        self._class_net = config.node.sysfs / "class" / "net"
        self._exclude = re.compile(config.node.network_exclude_interfaces)

    def collect(self, out: SampleSink) -> None:
        text = read_text(self._dev)
        if text is None:
            raise FileNotFoundError(self._dev)
        for line in text.splitlines()[2:]:
            interface, _, numbers = line.partition(":")
            interface = interface.strip()
            if not interface or self._exclude.match(interface):
                continue
            values = numbers.split()
            for column, spec in _COLUMNS.items():
                out.add(spec, int(values[column]), interface=interface)
            self._link(interface, out)

    def _link(self, interface: str, out: SampleSink) -> None:
        sysdir = self._class_net / interface
        operstate = (read_text(sysdir / "operstate") or "unknown").strip()
        out.add(UP, operstate == "up", interface=interface)
        out.add(MTU, read_int(sysdir / "mtu"), interface=interface)
        speed_mbps = read_int(sysdir / "speed")
        if speed_mbps is not None and speed_mbps > 0:
            out.add(SPEED, speed_mbps * 1_000_000 / 8, interface=interface)
        out.add(CARRIER_CHANGES, read_int(sysdir / "carrier_changes"), interface=interface)
        out.add_info(INFO, interface=interface, address=(read_text(sysdir / "address") or "").strip(),
                     operstate=operstate, duplex=(read_text(sysdir / "duplex") or "").strip())
