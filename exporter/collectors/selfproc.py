"""The exporter process's own CPU, memory, start time and file descriptors under the standard
`process_*` names (prometheus_client's ProcessCollector reads them), plus its thread count."""

from __future__ import annotations

from prometheus_client import ProcessCollector

from exporter.config import ExporterConfig
from exporter.framework.catalog import MetricSpec, counter, gauge
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "self"

# Declared here (docs/metrics.md, the live/catalog check), read by ProcessCollector: same names,
# types and units as every client library's process collector.
STANDARD: dict[str, MetricSpec] = {spec.name: spec for spec in (
    counter("process_cpu_seconds_total", "Total user and system CPU time of the exporter process.",
            collector=NAME, unit="seconds"),
    gauge("process_resident_memory_bytes", "Resident memory of the exporter process.", collector=NAME,
          unit="bytes"),
    gauge("process_virtual_memory_bytes", "Virtual memory of the exporter process.", collector=NAME, unit="bytes"),
    gauge("process_start_time_seconds", "Start time of the exporter process since the Unix epoch.",
          collector=NAME, unit="seconds"),
    gauge("process_open_fds", "File descriptors the exporter process has open.", collector=NAME),
    gauge("process_max_fds", "Most file descriptors the exporter process may open (RLIMIT_NOFILE).",
          collector=NAME),
)}
THREADS = gauge("raypulse_exporter_threads", "Threads of the exporter process (stuck collectors hold one).",
                collector=NAME)


@register
class SelfCollector(BlockingCollector):
    name = NAME
    description = "The exporter process's own CPU, memory, threads and open files (standard process_* names)."
    default_interval = 15.0

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._standard = ProcessCollector(registry=None)  # not registered: its samples go through our sink

    def collect(self, out: SampleSink) -> None:
        for family in self._standard.collect():
            for sample in family.samples:
                spec = STANDARD.get(sample.name)
                if spec is not None:
                    out.add(spec, sample.value)
        out.add(THREADS, _threads())


def _threads() -> int:
    """This process's threads, as the kernel counts them (C libraries' threads too)."""
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"Threads:"):
                return int(line.split()[1])
    raise OSError("/proc/self/status has no Threads: line")
