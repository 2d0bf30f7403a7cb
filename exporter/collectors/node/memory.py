"""Memory, swap and huge pages from /proc/meminfo."""

from __future__ import annotations

from exporter.collectors.files import read_key_values
from exporter.config import ExporterConfig
from exporter.framework.catalog import gauge
from exporter.framework.collector import BlockingCollector, register
from exporter.framework.shared import Shared
from exporter.framework.snapshot import SampleSink

NAME = "memory"


def _bytes(name: str, help: str, only_when: str | None = None):
    return gauge(f"raypulse_node_memory_{name}_bytes", help, collector=NAME, unit="bytes", only_when=only_when)


# meminfo key -> family; values are bytes (meminfo's kB converted).
_BYTES = {
    "MemTotal": _bytes("total", "Physical memory."),
    "MemAvailable": _bytes("available", "Memory available for new work without swapping (kernel estimate)."),
    "MemFree": _bytes("free", "Memory not used for anything."),
    "Buffers": _bytes("buffers", "Memory in block-device buffers."),
    "Cached": _bytes("cached", "Memory in the page cache (includes shared memory)."),
    "Shmem": _bytes("shared", "Shared memory and tmpfs, /dev/shm (Ray's object store) included."),
    "AnonPages": _bytes("anonymous", "Anonymous (process heap and stack) memory."),
    "Mapped": _bytes("mapped", "Files mapped into processes."),
    "Slab": _bytes("slab", "Kernel slab allocations."),
    "Dirty": _bytes("dirty", "Memory waiting to be written back to disk."),
    "Writeback": _bytes("writeback", "Memory being written back to disk now."),
    "Mlocked": _bytes("locked", "Memory locked with mlock (cannot be swapped or reclaimed)."),
    "Committed_AS": _bytes("committed", "Memory allocated by processes, whether touched or not."),
    "CommitLimit": _bytes("commit_limit", "Limit of committed memory under strict overcommit."),
    "SwapTotal": _bytes("swap_total", "Swap space."),
    "SwapFree": _bytes("swap_free", "Unused swap space."),
    "SwapCached": _bytes("swap_cached", "Swapped-out memory also still in RAM."),
    "Hugepagesize": _bytes("hugepage_size", "Size of a default huge page."),
    "HardwareCorrupted": _bytes("hardware_corrupted", "Memory the kernel took out of use after hardware errors.",
                                only_when="on kernels built with memory-failure handling"),
}
HUGEPAGES_TOTAL = gauge("raypulse_node_memory_hugepages", "Default-size huge pages in the pool.", collector=NAME)
HUGEPAGES_FREE = gauge("raypulse_node_memory_hugepages_free", "Default-size huge pages not allocated.",
                       collector=NAME)
_COUNTS = {"HugePages_Total": HUGEPAGES_TOTAL, "HugePages_Free": HUGEPAGES_FREE}


@register
class MemoryCollector(BlockingCollector):
    name = NAME
    description = "Memory, swap and huge pages (/proc/meminfo)."

    def __init__(self, config: ExporterConfig, shared: Shared | None = None) -> None:
        super().__init__(config, shared)
        self._path = config.node.procfs / "meminfo"

    def collect(self, out: SampleSink) -> None:
        meminfo = read_key_values(self._path)
        if meminfo is None:
            raise FileNotFoundError(self._path)
        for key, spec in _BYTES.items():
            out.add(spec, meminfo.get(key))
        for key, spec in _COUNTS.items():
            out.add(spec, meminfo.get(key))
