"""Who this node is: name, kernel, OS, architecture, boot time."""

from __future__ import annotations

import platform
import socket

from exporter.collectors.files import read_text
from exporter.config import ExporterConfig
from exporter.framework.catalog import gauge, info
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "host"

# `node_name`, not `node`: the target's `node` label (from /sd or a relabeling) would rename it exported_node.
NODE_INFO = info("raypulse_node_info", "Identity of the node (node_name: the exporter's node.name setting or the "
                 "hostname); join on instance for its name and OS.",
                 collector=NAME, labels=("node_name", "hostname", "kernel_release", "os", "architecture"))
BOOT_TIME = gauge("raypulse_node_boot_time_seconds", "Unix time the node booted.", collector=NAME,
                  unit="seconds")


def os_pretty_name(os_release: str | None) -> str:
    for line in (os_release or "").splitlines():
        key, _, value = line.partition("=")
        if key == "PRETTY_NAME":
            return value.strip().strip('"')
    return ""


@register
class HostCollector(BlockingCollector):
    name = NAME
    description = "Node identity (name, kernel, OS, architecture) and boot time."
    default_interval = 60.0

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._procfs = config.node.procfs
        self._rootfs = config.node.rootfs
        self._node_name = config.node.name

    def collect(self, out: SampleSink) -> None:
        hostname = socket.gethostname()
        os_release = (read_text(self._rootfs / "etc" / "os-release")
                      or read_text(self._rootfs / "usr" / "lib" / "os-release"))
        kernel = (read_text(self._procfs / "sys" / "kernel" / "osrelease") or platform.release()).strip()
        out.add_info(NODE_INFO, node_name=self._node_name or hostname, hostname=hostname, kernel_release=kernel,
                     os=os_pretty_name(os_release), architecture=platform.machine())
        for line in (read_text(self._procfs / "stat") or "").splitlines():
            if line.startswith("btime "):
                out.add(BOOT_TIME, int(line.split()[1]))
