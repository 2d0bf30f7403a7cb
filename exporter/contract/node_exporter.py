"""node_exporter's series behind the node panels, for nodes whose exporter leaves the node to it.

In the node-exporter-companion profile (exporter/profiles.py) a node's exporter does not read CPU,
memory, vmstat, disks, network or pressure; node_exporter on the same host does, and the head's
/sd gives it the node's `cluster` and `node` labels (exporter/serving/nodeexporter_sd.py). A panel that
reads one of those families writes its query twice, ours and node_exporter's, with the same
labels in the result, and `either` picks per node:

    (ours or on (cluster, node) (theirs and on (cluster, node) raypulse_exporter_build_info{...}))

raypulse's series where the node has them (a node with both is never counted twice),
node_exporter's otherwise, and only for nodes that run a raypulse exporter (a node_exporter
scraped by some other job, without our labels, stays out).

The names below are node_exporter's (1.5 and later, default collectors) with the labels they carry.
The dashboards (node panels) and the alerts (memory and OOM rules) read them; it sits in the
exporter's contract room, next to the label contract both already read, so that neither of them
imports the other (tests/test_layers.py).
"""

from __future__ import annotations

from exporter.config import NodeSettings

ON = "cluster, node"  # what ties a node_exporter target to a Ray node: the labels /sd gives both
_DEVICE = frozenset({"device"})
_CPU = frozenset({"cpu", "mode"})
_NONE: frozenset[str] = frozenset()

# raypulse node gauge -> node_exporter's, same meaning, unit and labels
MEMORY = {f"raypulse_node_memory_{ours}_bytes": f"node_memory_{theirs}_bytes" for ours, theirs in (
    ("total", "MemTotal"), ("available", "MemAvailable"), ("free", "MemFree"), ("buffers", "Buffers"),
    ("cached", "Cached"), ("shared", "Shmem"), ("anonymous", "AnonPages"), ("mapped", "Mapped"), ("slab", "Slab"),
    ("dirty", "Dirty"), ("writeback", "Writeback"), ("locked", "Mlocked"), ("committed", "Committed_AS"),
    ("commit_limit", "CommitLimit"), ("swap_total", "SwapTotal"), ("swap_free", "SwapFree"),
    ("swap_cached", "SwapCached"), ("hugepage_size", "Hugepagesize"), ("hardware_corrupted", "HardwareCorrupted"))}
GAUGES = {
    **MEMORY,
    "raypulse_node_memory_hugepages": "node_memory_HugePages_Total",
    "raypulse_node_memory_hugepages_free": "node_memory_HugePages_Free",
    "raypulse_node_load1": "node_load1", "raypulse_node_load5": "node_load5", "raypulse_node_load15": "node_load15",
    "raypulse_node_procs_running": "node_procs_running", "raypulse_node_procs_blocked": "node_procs_blocked",
}
# vmstat counts KiB for paging and pages for swapping; raypulse counts bytes. PromQL cannot know the
# page size: 4096 (x86-64, most arm64 kernels).
_PAGE = 4096
# raypulse node counter -> (node_exporter's, factor to raypulse's unit)
COUNTERS = {
    "raypulse_node_context_switches_total": ("node_context_switches_total", 1),
    "raypulse_node_interrupts_total": ("node_intr_total", 1),
    "raypulse_node_forks_total": ("node_forks_total", 1),
    "raypulse_node_page_faults_total": ("node_vmstat_pgfault", 1),
    "raypulse_node_major_page_faults_total": ("node_vmstat_pgmajfault", 1),
    "raypulse_node_paged_in_bytes_total": ("node_vmstat_pgpgin", 1024),
    "raypulse_node_paged_out_bytes_total": ("node_vmstat_pgpgout", 1024),
    "raypulse_node_swapped_in_bytes_total": ("node_vmstat_pswpin", _PAGE),
    "raypulse_node_swapped_out_bytes_total": ("node_vmstat_pswpout", _PAGE),
    "raypulse_node_oom_kills_total": ("node_vmstat_oom_kill", 1),
}
# Per device: the same names after the prefix.
DISK = {f"raypulse_node_disk_{name}": f"node_disk_{name}" for name in (
    "reads_completed_total", "reads_merged_total", "read_bytes_total", "read_time_seconds_total",
    "writes_completed_total", "writes_merged_total", "written_bytes_total", "write_time_seconds_total",
    "io_time_seconds_total", "io_time_weighted_seconds_total", "io_now")}
# Per interface: node_exporter's `device` is raypulse's `interface`.
NETWORK = {
    **{f"raypulse_node_network_{way}_{ours}": f"node_network_{way}_{theirs}"
       for way in ("receive", "transmit") for ours, theirs in (
           ("bytes_total", "bytes_total"), ("packets_total", "packets_total"), ("errors_total", "errs_total"),
           ("drops_total", "drop_total"))},
    "raypulse_node_network_up": "node_network_up", "raypulse_node_network_mtu_bytes": "node_network_mtu_bytes",
    "raypulse_node_network_speed_bytes_per_second": "node_network_speed_bytes",
    "raypulse_node_network_carrier_changes_total": "node_network_carrier_changes_total",
    "raypulse_node_network_info": "node_network_info",
}
PSI_WAITING = ("cpu", "memory", "io")  # node_exporter has no CPU `full` line
PSI_STALLED = ("memory", "io")
PRESSURE_STALLED = "node_pressure_{resource}_stalled_seconds_total"

# Every node_exporter family a panel reads, with its own labels (dashboards/selectors.py adds the target's).
FAMILIES: dict[str, frozenset[str]] = {
    **{name: _NONE for name in GAUGES.values()},
    **{name: _NONE for name, _ in COUNTERS.values()},
    **{name: _DEVICE for name in DISK.values()},
    **{name: _DEVICE for name in NETWORK.values()},
    "node_network_info": frozenset({"device", "address", "broadcast", "duplex", "ifalias", "operstate"}),
    "node_cpu_seconds_total": _CPU, "node_cpu_guest_seconds_total": _CPU,
    **{f"node_pressure_{resource}_waiting_seconds_total": _NONE for resource in PSI_WAITING},
    **{PRESSURE_STALLED.format(resource=resource): _NONE for resource in PSI_STALLED},
}


def _promql_regex(pattern: str) -> str:
    """A Python regex as the inside of a PromQL double-quoted string (RE2 reads the same syntax here)."""
    return pattern.replace("\\", "\\\\").replace('"', '\\"')


# node_exporter reports every interface and device; raypulse's defaults leave out virtual interfaces
# and partitions. The same patterns keep the two sources' totals comparable.
_defaults = NodeSettings()
NOT_EXCLUDED_INTERFACE = f'device!~"{_promql_regex(_defaults.network_exclude_interfaces)}"'
NOT_EXCLUDED_DISK = f'device!~"{_promql_regex(_defaults.disk_exclude_devices)}"'


def as_interface(expr: str) -> str:
    """node_exporter's `device` label copied to `interface`, raypulse's name for it."""
    return f'label_replace({expr}, "interface", "$1", "device", "(.*)")'


def per_resource(expr_of: dict[str, str]) -> str:
    """One PSI expression per resource, labelled `resource` as raypulse's are."""
    return " or ".join(f'label_replace({expr}, "resource", "{resource}", "", "")' for resource, expr in expr_of.items())


def either(ours: str, theirs: str, exporters: str) -> str:
    """Per node, `ours` where it has series, else `theirs` for nodes with a raypulse exporter.
    `exporters`: a selector of raypulse_exporter_build_info with the board's matchers."""
    return f"(({ours}) or on ({ON}) (({theirs}) and on ({ON}) {exporters}))"  # whole: `or` binds loosest
