"""Process, thread and file-descriptor counts against their kernel limits."""

from __future__ import annotations

import os

from exporter.collectors.files import read_int, read_text
from exporter.config import ExporterConfig
from exporter.framework.catalog import gauge
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "processes"

PROCESSES = gauge("raypulse_node_processes", "Processes on the node.", collector=NAME)
THREADS = gauge("raypulse_node_threads", "Threads (scheduling entities) on the node.", collector=NAME)
PID_MAX = gauge("raypulse_node_processes_limit", "Highest process id plus one (kernel.pid_max).", collector=NAME)
THREADS_MAX = gauge("raypulse_node_threads_limit", "Most threads the kernel allows (kernel.threads-max).",
                    collector=NAME)
FDS = gauge("raypulse_node_file_descriptors", "File handles allocated node-wide.", collector=NAME)
FDS_MAX = gauge("raypulse_node_file_descriptors_limit", "Most file handles the kernel allows (fs.file-max).",
                collector=NAME)


@register
class ProcessesCollector(BlockingCollector):
    name = NAME
    description = "Processes, threads and open file handles against their kernel limits (/proc)."
    default_interval = 15.0

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._procfs = config.node.procfs

    def collect(self, out: SampleSink) -> None:
        out.add(PROCESSES, sum(1 for entry in os.scandir(self._procfs) if entry.name.isdigit()))
        loadavg = read_text(self._procfs / "loadavg")  # "0.1 0.2 0.3 running/total lastpid"
        if loadavg is not None:
            out.add(THREADS, int(loadavg.split()[3].partition("/")[2]))
        out.add(PID_MAX, read_int(self._procfs / "sys" / "kernel" / "pid_max"))
        out.add(THREADS_MAX, read_int(self._procfs / "sys" / "kernel" / "threads-max"))
        file_nr = read_text(self._procfs / "sys" / "fs" / "file-nr")  # "allocated unused max"
        if file_nr is not None:
            allocated, _, maximum = (int(v) for v in file_nr.split())
            out.add(FDS, allocated)
            out.add(FDS_MAX, maximum)
