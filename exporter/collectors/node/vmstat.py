"""Paging, swapping and OOM kills from /proc/vmstat."""

from __future__ import annotations

import os

from exporter.collectors.files import read_key_values
from exporter.config import ExporterConfig
from exporter.framework.catalog import counter
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "vmstat"
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

PAGE_FAULTS = counter("raypulse_node_page_faults_total", "Page faults, minor and major.", collector=NAME)
MAJOR_PAGE_FAULTS = counter("raypulse_node_major_page_faults_total",
                            "Page faults that had to read from disk.", collector=NAME)
PAGED_IN = counter("raypulse_node_paged_in_bytes_total", "Bytes paged in from block devices.",
                   collector=NAME, unit="bytes")
PAGED_OUT = counter("raypulse_node_paged_out_bytes_total", "Bytes paged out to block devices.",
                    collector=NAME, unit="bytes")
SWAPPED_IN = counter("raypulse_node_swapped_in_bytes_total", "Bytes swapped in.", collector=NAME, unit="bytes")
SWAPPED_OUT = counter("raypulse_node_swapped_out_bytes_total", "Bytes swapped out.", collector=NAME, unit="bytes")
OOM_KILLS = counter("raypulse_node_oom_kills_total",
                    "Processes killed by the kernel's out-of-memory killer, node-wide.", collector=NAME,
                    only_when="on kernels 4.13 and newer")

# vmstat key -> (family, multiplier to the family's unit)
_FIELDS = {
    "pgfault": (PAGE_FAULTS, 1), "pgmajfault": (MAJOR_PAGE_FAULTS, 1),
    "pgpgin": (PAGED_IN, 1024), "pgpgout": (PAGED_OUT, 1024),  # pgpgin/out are in KiB
    "pswpin": (SWAPPED_IN, _PAGE_SIZE), "pswpout": (SWAPPED_OUT, _PAGE_SIZE),
    "oom_kill": (OOM_KILLS, 1),
}


@register
class VmstatCollector(BlockingCollector):
    name = NAME
    description = "Page faults, paging, swapping and OOM kills (/proc/vmstat)."

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._path = config.node.procfs / "vmstat"

    def collect(self, out: SampleSink) -> None:
        vmstat = read_key_values(self._path)
        if vmstat is None:
            raise FileNotFoundError(self._path)
        for key, (spec, scale) in _FIELDS.items():
            if key in vmstat:
                out.add(spec, vmstat[key] * scale)
