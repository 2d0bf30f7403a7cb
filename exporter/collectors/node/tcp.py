"""TCP: connections by state, segments, retransmits, resets and listen-queue overflows.

Counters come from /proc/net/snmp and /proc/net/netstat; states are counted from
/proc/net/tcp and tcp6 (one pass over the socket tables of the exporter's network namespace).
"""

from __future__ import annotations

import os

from exporter.collectors.files import read_table_rows, read_text
from exporter.config import ExporterConfig
from exporter.framework.catalog import counter, gauge
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "tcp"
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# Kernel socket states (include/net/tcp_states.h), by the hex code the socket tables print.
STATES = {"01": "established", "02": "syn_sent", "03": "syn_recv", "04": "fin_wait1", "05": "fin_wait2",
          "06": "time_wait", "07": "close", "08": "close_wait", "09": "last_ack", "0A": "listen",
          "0B": "closing", "0C": "new_syn_recv"}

CONNECTIONS = gauge("raypulse_node_tcp_connections", "TCP sockets by state (IPv4 and IPv6).", collector=NAME,
                    labels=("state",))


def _counter(name: str, help: str):
    return counter(f"raypulse_node_tcp_{name}", help, collector=NAME)


# (table, key) in /proc/net/snmp or /proc/net/netstat -> family
_COUNTERS = {
    ("Tcp", "ActiveOpens"): _counter("active_opens_total", "Connections this node opened."),
    ("Tcp", "PassiveOpens"): _counter("passive_opens_total", "Connections this node accepted."),
    ("Tcp", "AttemptFails"): _counter("failed_connection_attempts_total", "Connection attempts that failed."),
    ("Tcp", "EstabResets"): _counter("established_resets_total", "Established connections reset."),
    ("Tcp", "InSegs"): _counter("received_segments_total", "Segments received."),
    ("Tcp", "OutSegs"): _counter("sent_segments_total", "Segments sent."),
    ("Tcp", "RetransSegs"): _counter("retransmitted_segments_total", "Segments retransmitted."),
    ("Tcp", "InErrs"): _counter("receive_errors_total", "Segments received with errors."),
    ("Tcp", "OutRsts"): _counter("sent_resets_total", "Segments sent with the RST flag."),
    ("TcpExt", "ListenOverflows"): _counter("listen_overflows_total", "Times a listen queue was full."),
    ("TcpExt", "ListenDrops"): _counter("listen_drops_total", "Connection requests dropped by a listener."),
    ("TcpExt", "TCPSynRetrans"): _counter("syn_retransmits_total", "SYN segments retransmitted."),
    ("TcpExt", "TCPTimeouts"): _counter("timeouts_total", "Retransmission timeouts."),
    ("TcpExt", "TCPAbortOnTimeout"): _counter("aborted_on_timeout_total",
                                              "Connections aborted after too many retransmission timeouts."),
}
CURRENT_ESTABLISHED = gauge("raypulse_node_tcp_established", "TCP connections now established or closing-wait.",
                            collector=NAME)
SOCKETS_USED = gauge("raypulse_node_sockets_used", "Sockets of all protocols in use.", collector=NAME)
ORPHANS = gauge("raypulse_node_tcp_orphan_sockets", "TCP sockets no longer attached to a process.",
                collector=NAME)
TCP_MEMORY = gauge("raypulse_node_tcp_memory_bytes", "Memory used by TCP socket buffers.", collector=NAME,
                   unit="bytes")


@register
class TcpCollector(BlockingCollector):
    name = NAME
    description = ("TCP connections by state, segments, retransmits, resets, listen overflows "
                   "(/proc/net/{snmp,netstat,sockstat,tcp,tcp6}).")
    default_interval = 15.0

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._net = config.node.procfs / "net"

    def collect(self, out: SampleSink) -> None:
        tables = read_table_rows(self._net / "snmp")
        if tables is None:
            raise FileNotFoundError(self._net / "snmp")
        tables |= read_table_rows(self._net / "netstat") or {}
        for (table, key), spec in _COUNTERS.items():
            out.add(spec, tables.get(table, {}).get(key))
        out.add(CURRENT_ESTABLISHED, tables.get("Tcp", {}).get("CurrEstab"))
        self._sockstat(out)
        self._states(out)

    def _sockstat(self, out: SampleSink) -> None:
        text = read_text(self._net / "sockstat") or ""
        for line in text.splitlines():
            protocol, _, rest = line.partition(":")
            fields = rest.split()
            values = dict(zip(fields[::2], (int(v) for v in fields[1::2]), strict=False))
            if protocol == "sockets":
                out.add(SOCKETS_USED, values.get("used"))
            elif protocol == "TCP":
                out.add(ORPHANS, values.get("orphan"))
                if "mem" in values:
                    out.add(TCP_MEMORY, values["mem"] * _PAGE_SIZE)

    def _states(self, out: SampleSink) -> None:
        counts = dict.fromkeys(STATES.values(), 0)
        for table in ("tcp", "tcp6"):
            text = read_text(self._net / table)
            for line in (text or "").splitlines()[1:]:
                fields = line.split(maxsplit=4)
                if len(fields) > 3 and fields[3] in STATES:
                    counts[STATES[fields[3]]] += 1
        for state, count in counts.items():
            out.add(CONNECTIONS, count, state=state)
