"""Collector profiles: which collectors run when the configuration does not name them.

Most clusters already run node_exporter. The `node-exporter-companion` profile leaves to it what
its default collectors read as well (so the node is not read twice) and keeps what only raypulse
has. `none` is node_exporter's `--collector.disable-defaults`: nothing runs unless named. A
collector named in the configuration (`collectors.<name>.enabled`, `--enable-collector`,
`--collector.<name>`, ...) runs or not as named, whatever the profile.

Standard library only: exporter/config.py (a leaf) imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

DEFAULT = "default"
COMPANION = "node-exporter-companion"
NONE = "none"
NAMES = (DEFAULT, COMPANION, NONE)

# Collector -> the node_exporter collectors (all on by default) that read the same, and what.
LEFT_TO_NODE_EXPORTER: Mapping[str, str] = MappingProxyType({
    "cpu": "`cpu`, `loadavg` and `stat`: CPU time by mode, guest time, load averages, context switches, "
           "interrupts, forks, runnable and blocked tasks",
    "memory": "`meminfo`: every /proc/meminfo line, huge pages included",
    "vmstat": "`vmstat`: its default fields are page faults, paging, swapping and `oom_kill`",
    "disk": "`diskstats`: the same /proc/diskstats counters, partitions left out by the same default pattern",
    "network": "`netdev` and `netclass`: traffic, packets, errors and drops; link state, MTU, speed, carrier changes",
    "pressure": "`pressure`: PSI of CPU, memory and I/O (waiting; memory and I/O stalled)",
})

# Node collectors the companion profile keeps, and what node_exporter's defaults lack.
KEPT_BESIDE_NODE_EXPORTER: Mapping[str, str] = MappingProxyType({
    "filesystem": "the watched paths: which mount holds the checkpoint paths, Ray's temp dir and the object "
                  "store (`raypulse_node_filesystem_path_info`, joined with this exporter's own mount series); "
                  "stuck-mount detection with a bounded statvfs",
    "tcp": "connections by state and the AttemptFails, EstabResets and TCPAbortOnTimeout counters: node_exporter's "
           "`tcpstat` is off by default and its `netstat` default fields leave those out",
    "processes": "processes and threads against pid_max and threads-max: node_exporter's `processes` is off by "
                 "default",
    "infiniband": "mlx5 `hw_counters` (RoCE congestion: out-of-sequence, CNPs, timeouts), which node_exporter's "
                  "`infiniband` does not read, on the fabric collectives run over",
    "host": "`raypulse_node_info` with the node's name as /sd gives it, for joins; two series a minute",
})


def turns_off(profile: str, collector: str) -> bool:
    """Whether `profile` turns `collector` off when the configuration does not name it."""
    return profile == NONE or (profile == COMPANION and collector in LEFT_TO_NODE_EXPORTER)


def discovers_node_exporter(profile: str) -> bool:
    """Whether the head's /sd lists every node's node_exporter unless told otherwise."""
    return profile == COMPANION
