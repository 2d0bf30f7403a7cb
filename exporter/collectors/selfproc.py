"""The exporter process's own CPU, memory, threads and file descriptors (psutil)."""

from __future__ import annotations

import psutil

from exporter.catalog import counter, gauge
from exporter.collector import BlockingCollector, register
from exporter.config import ExporterConfig
from exporter.shared import Shared
from exporter.snapshot import SampleSink

NAME = "self"

RESIDENT_MEMORY = gauge("raypulse_exporter_resident_memory_bytes", "Resident memory of the exporter process.",
                        collector=NAME, unit="bytes")
CPU_SECONDS = counter("raypulse_exporter_cpu_seconds_total", "CPU time used by the exporter process.",
                      collector=NAME, unit="seconds")
THREADS = gauge("raypulse_exporter_threads", "Threads of the exporter process (stuck collectors hold one).",
                collector=NAME)
OPEN_FDS = gauge("raypulse_exporter_open_fds", "File descriptors the exporter process has open.", collector=NAME)


@register
class SelfCollector(BlockingCollector):
    name = NAME
    description = "The exporter process's own CPU, memory, threads and open files."
    default_interval = 15.0

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._process = psutil.Process()

    def collect(self, out: SampleSink) -> None:
        with self._process.oneshot():
            out.add(RESIDENT_MEMORY, self._process.memory_info().rss)
            times = self._process.cpu_times()
            out.add(CPU_SECONDS, times.user + times.system)
            out.add(THREADS, self._process.num_threads())
            out.add(OPEN_FDS, self._process.num_fds())
