"""Block device I/O from /proc/diskstats (whole devices; partitions and loops are filtered out)."""

from __future__ import annotations

import re

from exporter.collectors.files import read_text
from exporter.config import ExporterConfig
from exporter.framework.catalog import counter, gauge
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "disk"
_SECTOR_BYTES = 512  # diskstats counts 512-byte sectors whatever the device's sector size
_LABELS = ("device",)


def _counter(name: str, help: str, unit: str = ""):
    return counter(f"raypulse_node_disk_{name}", help, collector=NAME, labels=_LABELS, unit=unit)


READS = _counter("reads_completed_total", "Reads completed.")
READS_MERGED = _counter("reads_merged_total", "Adjacent reads merged into one.")
READ_BYTES = _counter("read_bytes_total", "Bytes read.", "bytes")
READ_TIME = _counter("read_time_seconds_total", "Time spent on reads (summed over concurrent reads).", "seconds")
WRITES = _counter("writes_completed_total", "Writes completed.")
WRITES_MERGED = _counter("writes_merged_total", "Adjacent writes merged into one.")
WRITTEN_BYTES = _counter("written_bytes_total", "Bytes written.", "bytes")
WRITE_TIME = _counter("write_time_seconds_total", "Time spent on writes (summed over concurrent writes).",
                      "seconds")
IO_TIME = _counter("io_time_seconds_total", "Time the device had I/O in flight (its busy time).", "seconds")
IO_WEIGHTED_TIME = _counter("io_time_weighted_seconds_total",
                            "I/O time weighted by requests in flight (queue depth over time).", "seconds")
IO_NOW = gauge("raypulse_node_disk_io_now", "I/O requests in flight now.", collector=NAME, labels=_LABELS)

# Field index after "major minor name" -> (family, multiplier to the family's unit)
_FIELDS = ((0, READS, 1), (1, READS_MERGED, 1), (2, READ_BYTES, _SECTOR_BYTES), (3, READ_TIME, 1e-3),
           (4, WRITES, 1), (5, WRITES_MERGED, 1), (6, WRITTEN_BYTES, _SECTOR_BYTES), (7, WRITE_TIME, 1e-3),
           (8, IO_NOW, 1), (9, IO_TIME, 1e-3), (10, IO_WEIGHTED_TIME, 1e-3))


@register
class DiskCollector(BlockingCollector):
    name = NAME
    description = "Block device reads, writes, bytes, busy time and queue depth (/proc/diskstats)."

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._path = config.node.procfs / "diskstats"
        self._exclude = re.compile(config.node.disk_exclude_devices)

    def collect(self, out: SampleSink) -> None:
        text = read_text(self._path)
        if text is None:
            raise FileNotFoundError(self._path)
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 14 or self._exclude.match(parts[2]):
                continue
            device, values = parts[2], [int(v) for v in parts[3:14]]
            for index, spec, scale in _FIELDS:
                out.add(spec, values[index] * scale, device=device)
