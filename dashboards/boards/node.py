"""Node / pod: one node or all, laid out like Node Exporter Full (headline stats, then the basic
four, then a collapsed row per subsystem) from raypulse_node_* and raypulse_pod_*, plus what
Ray runs on the node (its processes by job, the object store).

Panels on what node_exporter reads too (CPU, memory, vmstat, disks, network, pressure) read its
series for nodes whose exporter leaves those to it (exporter/contract/node_exporter.py)."""

from __future__ import annotations

from dashboards.boards.common import NOT_IDLE, NOT_IDLE_ONLY, NOT_LOOPBACK, UID_NODE, rate, to_job
from dashboards.model import Board, Panel, Row, Target
from dashboards.selectors import Scope
from exporter.contract import node_exporter as ne

S = Scope("cluster", "node")
BY = "cluster, node"
CPUS = f"sum by ({BY}) ({S('raypulse_node_cpus')})"
THEIR_CPUS = f"count by ({BY}) ({S('node_cpu_seconds_total', mode='idle')})"  # one idle series per CPU


def either(ours: str, theirs: str) -> str:
    return ne.either(ours, theirs, S("raypulse_exporter_build_info"))


def _busy() -> str:
    return either(f"sum by ({BY}) ({rate(S('raypulse_node_cpu_seconds_total', NOT_IDLE))}) / {CPUS}",
                  f"sum by ({BY}) ({rate(S('node_cpu_seconds_total', NOT_IDLE))}) / {THEIR_CPUS}")


def _mem_used() -> str:
    return either(f"1 - {S('raypulse_node_memory_available_bytes')} / {S('raypulse_node_memory_total_bytes')}",
                  f"1 - {S('node_memory_MemAvailable_bytes')} / {S('node_memory_MemTotal_bytes')}")


def _gauge(name: str) -> str:
    """The family's selector, or node_exporter's equivalent for a node without it."""
    return either(S(name), S(ne.GAUGES[name])) if name in ne.GAUGES else S(name)


def _series(*names: str, legend: str = "{{node}} ") -> tuple[Target, ...]:
    """One target per family, legend `<node> <short family name>`."""
    return tuple(Target(_gauge(name), legend + name.split("_", 2)[-1].removesuffix("_bytes")) for name in names)


def _rate_sum(name: str) -> str:
    ours = f"sum by ({BY}) ({rate(S(name))})"
    if name not in ne.COUNTERS:
        return ours
    theirs, factor = ne.COUNTERS[name]
    return either(ours, f"sum by ({BY}) ({rate(S(theirs))})" + (f" * {factor}" if factor != 1 else ""))


def _rates(*names: str) -> tuple[Target, ...]:
    return tuple(Target(_rate_sum(name), "{{node}} " + name.split("_", 2)[-1].removesuffix("_total"))
                 for name in names)


OVERVIEW = Row("Overview", collapsed=False, panels=(
    Panel("CPU busy", "percentunit", (Target(_busy(), "{{node}}"),),
          "Share of all CPUs not idle or waiting for I/O.", kind="stat", width=4, height=5, min=0, max=1,
          thresholds=((None, "green"), (0.85, "orange"), (0.95, "red"))),
    Panel("Memory used", "percentunit", (Target(_mem_used(), "{{node}}"),),
          "1 - MemAvailable / MemTotal.", kind="stat", width=4, height=5, min=0, max=1,
          thresholds=((None, "green"), (0.85, "orange"), (0.95, "red"))),
    Panel("Load per CPU (5m)", "short", (Target(either(f"{S('raypulse_node_load5')} / {S('raypulse_node_cpus')}",
                                                       f"{S('node_load5')} / on ({BY}) {THEIR_CPUS}"), "{{node}}"),),
          "5-minute load average divided by the number of CPUs; above 1 means work waits.", kind="stat",
          width=4, height=5, decimals=2),
    Panel("CPUs", "short", (Target(either(S("raypulse_node_cpus"), THEIR_CPUS), "{{node}}"),),
          "Online CPUs of the node.",
          kind="stat", width=3, height=5),
    Panel("Memory size", "bytes", (Target(_gauge("raypulse_node_memory_total_bytes"), "{{node}}"),), "MemTotal.",
          kind="stat", width=3, height=5),
    Panel("Uptime", "s", (Target(f"time() - {S('raypulse_node_boot_time_seconds')}", "{{node}}"),),
          "Time since the node booted.", kind="stat", width=3, height=5),
    Panel("Node", "short", (Target(S("raypulse_node_info"), instant=True),),
          "Identity of the node: host name, kernel, OS, architecture.", kind="table", width=3, height=5),
    Panel("CPU busy by node", "percentunit", (Target(_busy(), "{{node}}"),),
          "Share of all CPUs not idle or waiting for I/O.", width=6, min=0, max=1),
    Panel("Memory used by node", "percentunit", (Target(_mem_used(), "{{node}}"),),
          "1 - MemAvailable / MemTotal.", width=6, min=0, max=1),
    Panel("Network traffic", "Bps", tuple(
        Target(either(f"sum by ({BY}) ({rate(S(f'raypulse_node_network_{way}_bytes_total', NOT_LOOPBACK))})",
                      f"sum by ({BY}) ({rate(S(f'node_network_{way}_bytes_total', ne.NOT_EXCLUDED_INTERFACE))})"),
               "{{node}} " + way) for way in ("receive", "transmit")),
        "Bytes per second over every interface but loopback.", width=6),
    Panel("Filesystem used", "percentunit", (
        Target(f"1 - {S('raypulse_node_filesystem_avail_bytes')} / {S('raypulse_node_filesystem_size_bytes')}",
               "{{node}} {{mountpoint}}"),),
        "Share of each filesystem not available to unprivileged users.", width=6, min=0, max=1),
))

CPU = Row("CPU", (
    Panel("CPU by mode", "percentunit", (
        Target(either(f"sum by ({BY}, mode) ({rate(S('raypulse_node_cpu_seconds_total', NOT_IDLE_ONLY))}) "
                      f"/ on ({BY}) group_left () {CPUS}",
                      f"sum by ({BY}, mode) ({rate(S('node_cpu_seconds_total', NOT_IDLE_ONLY))}) "
                      f"/ on ({BY}) group_left () {THEIR_CPUS}"), "{{node}} {{mode}}"),),
        "Share of all CPUs by mode (idle left out).", stack=True, min=0),
    Panel("Guest CPU", "suffix: cores", (
        Target(either(f"sum by ({BY}, mode) ({rate(S('raypulse_node_cpu_guest_seconds_total'))})",
                      f"sum by ({BY}, mode) ({rate(S('node_cpu_guest_seconds_total'))})"), "{{node}} {{mode}}"),),
        "CPUs running virtual machines' guests.", min=0),
    Panel("Load average", "short", _series("raypulse_node_load1", "raypulse_node_load5", "raypulse_node_load15"),
          "Run-queue length averaged over 1, 5 and 15 minutes.", min=0),
    Panel("Processes running / blocked", "short",
          _series("raypulse_node_procs_running", "raypulse_node_procs_blocked"),
          "Processes runnable now and blocked on I/O.", min=0),
    Panel("Context switches, interrupts, forks", "ops",
          _rates("raypulse_node_context_switches_total", "raypulse_node_interrupts_total",
                 "raypulse_node_forks_total"), "Per second, whole node.", min=0),
))

MEMORY = Row("Memory", (
    Panel("Memory breakdown", "bytes", _series(
        "raypulse_node_memory_anonymous_bytes", "raypulse_node_memory_cached_bytes",
        "raypulse_node_memory_buffers_bytes", "raypulse_node_memory_shared_bytes", "raypulse_node_memory_slab_bytes",
        "raypulse_node_memory_free_bytes", "raypulse_node_memory_available_bytes"),
        "Where the memory goes; shared includes /dev/shm, where Ray's object store lives.", width=12, min=0),
    Panel("Commit", "bytes", _series("raypulse_node_memory_committed_bytes", "raypulse_node_memory_commit_limit_bytes"),
          "Committed_AS against CommitLimit.", min=0),
    Panel("Dirty, writeback, mapped, locked", "bytes", _series(
        "raypulse_node_memory_dirty_bytes", "raypulse_node_memory_writeback_bytes",
        "raypulse_node_memory_mapped_bytes", "raypulse_node_memory_locked_bytes"),
        "Pages waiting for or being written back, mapped files, mlocked memory.", min=0),
    Panel("Swap", "bytes", (
        Target(either(f"{S('raypulse_node_memory_swap_total_bytes')} - {S('raypulse_node_memory_swap_free_bytes')}",
                      f"{S('node_memory_SwapTotal_bytes')} - {S('node_memory_SwapFree_bytes')}"),
               "{{node}} used"), *_series("raypulse_node_memory_swap_total_bytes",
                                          "raypulse_node_memory_swap_cached_bytes")),
        "Swap in use, its size, and swapped pages also in memory.", min=0),
    Panel("Huge pages", "short", _series("raypulse_node_memory_hugepages", "raypulse_node_memory_hugepages_free"),
          "Huge pages configured and free.", min=0),
    Panel("Huge page size", "bytes", _series("raypulse_node_memory_hugepage_size_bytes"),
          "Size of one huge page.", kind="stat"),
    Panel("Hardware corrupted memory", "bytes", _series("raypulse_node_memory_hardware_corrupted_bytes"),
          "Memory the kernel took out of use after hardware errors (kernels with memory-failure handling).",
          min=0),
    Panel("Page faults", "ops", _rates("raypulse_node_page_faults_total", "raypulse_node_major_page_faults_total"),
          "Page faults per second; major faults read from disk.", min=0),
    Panel("Paging and swapping", "Bps", _rates(
        "raypulse_node_paged_in_bytes_total", "raypulse_node_paged_out_bytes_total",
        "raypulse_node_swapped_in_bytes_total", "raypulse_node_swapped_out_bytes_total"),
        "Bytes per second paged and swapped in and out.", min=0),
    Panel("Kernel OOM kills", "short", (
        Target(either(f"sum by ({BY}) (increase({S('raypulse_node_oom_kills_total')}[$__rate_interval]))",
                      f"sum by ({BY}) (increase({S('node_vmstat_oom_kill')}[$__rate_interval]))"), "{{node}}"),),
        "Processes the kernel's OOM killer ended (any cgroup on the node).", min=0),
))

def _psi(kind: str, resources: tuple[str, ...]) -> str:
    """PSI `kind` (waiting: some, stalled: full) by resource; node_exporter has a family per resource."""
    theirs = {resource: f"sum by ({BY}) ({rate(S(f'node_pressure_{resource}_{kind}_seconds_total'))})"
              for resource in resources}
    return either(f"sum by ({BY}, resource) ({rate(S(f'raypulse_node_pressure_{kind}_seconds_total'))})",
                  ne.per_resource(theirs))


PRESSURE = Row("Pressure (PSI)", (
    Panel("Node: some task waiting", "percentunit", (Target(_psi("waiting", ne.PSI_WAITING), "{{node}} {{resource}}"),),
        "Share of time at least one task waited for CPU, memory or I/O (PSI some).", min=0, max=1),
    Panel("Node: all tasks stalled", "percentunit", (Target(_psi("stalled", ne.PSI_STALLED), "{{node}} {{resource}}"),),
        "Share of time every non-idle task was stalled (PSI full).", min=0, max=1),
    Panel("Pod: waiting / stalled", "percentunit", (
        Target(f"sum by ({BY}, resource) ({rate(S('raypulse_pod_pressure_waiting_seconds_total'))})",
               "{{node}} {{resource}} some"),
        Target(f"sum by ({BY}, resource) ({rate(S('raypulse_pod_pressure_stalled_seconds_total'))})",
               "{{node}} {{resource}} full")),
        "The same for the exporter's pod or container cgroup.", min=0, max=1),
))


def _per_device(selector: str) -> str:
    return f"sum by ({BY}, device) ({rate(selector)})"


def _their_disk(name: str) -> str:
    return S(ne.DISK[name], ne.NOT_EXCLUDED_DISK)


def _disk(name: str, of: str = "") -> str:
    """Per device per second; with `of`, per operation of that counter (a latency)."""
    if of:
        return either(f"{_per_device(S(name))} / {_per_device(S(of))}",
                      f"{_per_device(_their_disk(name))} / {_per_device(_their_disk(of))}")
    return either(_per_device(S(name)), _per_device(_their_disk(name)))


DISKS = Row("Disks", (
    Panel("Disk throughput", "Bps", (
        Target(_disk("raypulse_node_disk_read_bytes_total"), "{{node}} {{device}} read"),
        Target(_disk("raypulse_node_disk_written_bytes_total"), "{{node}} {{device}} write")),
        "Bytes per second read and written per device.", min=0),
    Panel("Disk IOPS", "iops", (
        Target(_disk("raypulse_node_disk_reads_completed_total"), "{{node}} {{device}} reads"),
        Target(_disk("raypulse_node_disk_writes_completed_total"), "{{node}} {{device}} writes"),
        Target(_disk("raypulse_node_disk_reads_merged_total"), "{{node}} {{device}} reads merged"),
        Target(_disk("raypulse_node_disk_writes_merged_total"), "{{node}} {{device}} writes merged")),
        "Completed and merged operations per second.", min=0),
    Panel("Disk latency", "s", (
        Target(_disk("raypulse_node_disk_read_time_seconds_total", of="raypulse_node_disk_reads_completed_total"),
               "{{node}} {{device}} read"),
        Target(_disk("raypulse_node_disk_write_time_seconds_total", of="raypulse_node_disk_writes_completed_total"),
               "{{node}} {{device}} write")),
        "Average time per completed operation (gaps: no operations).", min=0),
    Panel("Disk busy", "percentunit", (
        Target(_disk("raypulse_node_disk_io_time_seconds_total"), "{{node}} {{device}}"),),
        "Share of time the device had I/O in flight.", min=0, max=1),
    Panel("Disk queue", "short", (
        Target(_disk("raypulse_node_disk_io_time_weighted_seconds_total"), "{{node}} {{device}} average queue"),
        Target(either(S("raypulse_node_disk_io_now"), S("node_disk_io_now", ne.NOT_EXCLUDED_DISK)),
               "{{node}} {{device}} in flight")),
        "Average queue length (weighted I/O time per second) and operations in flight now.", min=0),
))


def _fs_join(expr: str) -> str:
    """`expr` (one series per mount) for each watched path: several paths may share a mount."""
    return f"{S('raypulse_node_filesystem_path_info')} * on (instance, mountpoint) group_left () ({expr})"


FILESYSTEMS = Row("Filesystems", (
    Panel("Space available", "bytes", (
        Target(S("raypulse_node_filesystem_avail_bytes"), "{{node}} {{mountpoint}} available"),
        Target(S("raypulse_node_filesystem_free_bytes"), "{{node}} {{mountpoint}} free"),
        Target(S("raypulse_node_filesystem_size_bytes"), "{{node}} {{mountpoint}} size")),
        "Available (to unprivileged users), free (including the root reserve) and total bytes.", min=0),
    Panel("Watched paths (checkpoints, Ray temp, object store)", "percentunit", (
        Target(_fs_join(f"1 - {S('raypulse_node_filesystem_avail_bytes')} / "
                        f"{S('raypulse_node_filesystem_size_bytes')}"), "{{node}} {{role}} {{path}}"),),
        "How full the volumes under the checkpoint paths, Ray's temp dir and /dev/shm are.", min=0, max=1),
    Panel("Inodes free", "percentunit", (
        Target(f"{S('raypulse_node_filesystem_files_free')} / {S('raypulse_node_filesystem_files')}",
               "{{node}} {{mountpoint}}"),),
        "Share of inodes still free.", min=0, max=1),
    Panel("Read-only or failing mounts", "short", (
        Target(f"sum by ({BY}) ({S('raypulse_node_filesystem_readonly')})", "{{node}} read-only"),
        Target(f"sum by ({BY}) ({S('raypulse_node_filesystem_device_error')})", "{{node}} statvfs failing")),
        "Mounts that are read-only, and mounts whose statvfs fails (a dead NFS server, a lost disk).", min=0),
    Panel("Mounts", "short", (
        Target(S("raypulse_node_filesystem_info"), instant=True),), "Device and type of each mount.", kind="table",
        width=16),
))


def _their_net(name: str) -> str:
    return S(ne.NETWORK[name], ne.NOT_EXCLUDED_INTERFACE)


def _net(name: str, over: str = "rate") -> str:
    """Per interface: the counter's rate (or `changes`) over the rate interval."""
    return either(f"sum by ({BY}, interface) ({over}({S(name)}[$__rate_interval]))",
                  ne.as_interface(f"sum by ({BY}, device) ({over}({_their_net(name)}[$__rate_interval]))"))


def _net_gauge(name: str) -> str:
    return either(S(name), ne.as_interface(_their_net(name)))


NETWORK = Row("Network", (
    Panel("Traffic by interface", "Bps", (
        Target(_net("raypulse_node_network_receive_bytes_total"), "{{node}} {{interface}} receive"),
        Target(_net("raypulse_node_network_transmit_bytes_total"), "{{node}} {{interface}} transmit")),
        "Bytes per second.", min=0),
    Panel("Network packets", "pps", (
        Target(_net("raypulse_node_network_receive_packets_total"), "{{node}} {{interface}} receive"),
        Target(_net("raypulse_node_network_transmit_packets_total"), "{{node}} {{interface}} transmit")),
        "Packets per second.", min=0),
    Panel("Errors and drops", "pps", (
        Target(_net("raypulse_node_network_receive_errors_total"), "{{node}} {{interface}} receive errors"),
        Target(_net("raypulse_node_network_transmit_errors_total"), "{{node}} {{interface}} transmit errors"),
        Target(_net("raypulse_node_network_receive_drops_total"), "{{node}} {{interface}} receive drops"),
        Target(_net("raypulse_node_network_transmit_drops_total"), "{{node}} {{interface}} transmit drops")),
        "Per second; drops on a busy NIC starve collective communication.", min=0),
    Panel("Link", "short", (
        Target(_net_gauge("raypulse_node_network_up"), "{{node}} {{interface}} up"),
        Target(_net("raypulse_node_network_carrier_changes_total", over="changes"),
               "{{node}} {{interface}} carrier changes")),
        "1 while the interface is up; carrier changes (link flaps) in each interval.", min=0),
    Panel("Link speed", "Bps", (Target(_net_gauge("raypulse_node_network_speed_bytes_per_second"),
                                       "{{node}} {{interface}}"),),
          "Negotiated speed of interfaces that report one (not virtual ones).", min=0),
    Panel("MTU", "bytes", (Target(_net_gauge("raypulse_node_network_mtu_bytes"), "{{node}} {{interface}}"),),
          "Maximum transmission unit.", min=0),
    Panel("Interfaces", "short", (Target(_net_gauge("raypulse_node_network_info"), instant=True),),
          "Address, state and duplex of each interface.", kind="table", width=24),
))

TCP = Row("TCP", (
    Panel("Connections by state", "short", (
        Target(f"sum by ({BY}, state) ({S('raypulse_node_tcp_connections')})", "{{node}} {{state}}"),
        Target(S("raypulse_node_tcp_established"), "{{node}} established (snmp)")),
        "TCP sockets by state.", min=0),
    Panel("Retransmitted share", "percentunit", (
        Target(f"sum by ({BY}) ({rate(S('raypulse_node_tcp_retransmitted_segments_total'))}) / "
               f"sum by ({BY}) ({rate(S('raypulse_node_tcp_sent_segments_total'))})", "{{node}}"),),
        "Retransmitted segments / sent segments.", min=0),
    Panel("Segments", "pps", _rates(
        "raypulse_node_tcp_sent_segments_total", "raypulse_node_tcp_received_segments_total",
        "raypulse_node_tcp_retransmitted_segments_total", "raypulse_node_tcp_syn_retransmits_total"),
          "Per second.", min=0),
    Panel("Opens, failures, resets", "ops", _rates(
        "raypulse_node_tcp_active_opens_total", "raypulse_node_tcp_passive_opens_total",
        "raypulse_node_tcp_failed_connection_attempts_total", "raypulse_node_tcp_established_resets_total",
        "raypulse_node_tcp_sent_resets_total"), "Per second.", min=0),
    Panel("Listen queue, timeouts, errors", "ops", _rates(
        "raypulse_node_tcp_listen_overflows_total", "raypulse_node_tcp_listen_drops_total",
        "raypulse_node_tcp_timeouts_total", "raypulse_node_tcp_aborted_on_timeout_total",
        "raypulse_node_tcp_receive_errors_total"),
        "Per second; listen drops mean a server (the Ray GCS, the dashboard) accepts too slowly.", min=0),
    Panel("Sockets", "short", _series("raypulse_node_sockets_used", "raypulse_node_tcp_orphan_sockets"),
          "Sockets in use and orphaned TCP sockets.", min=0),
    Panel("TCP memory", "bytes", _series("raypulse_node_tcp_memory_bytes"), "Memory the kernel uses for TCP.",
          min=0),
))


def _ib(name: str) -> str:
    return f"sum by ({BY}, device, port) ({rate(S(name))})"


INFINIBAND = Row("InfiniBand / RoCE", (
    Panel("InfiniBand traffic", "Bps", (
        Target(_ib("raypulse_node_infiniband_receive_bytes_total"), "{{node}} {{device}}:{{port}} receive"),
        Target(_ib("raypulse_node_infiniband_transmit_bytes_total"), "{{node}} {{device}}:{{port}} transmit")),
        "Bytes per second per port.", min=0),
    Panel("InfiniBand packets", "pps", (
        Target(_ib("raypulse_node_infiniband_receive_packets_total"), "{{node}} {{device}}:{{port}} receive"),
        Target(_ib("raypulse_node_infiniband_transmit_packets_total"), "{{node}} {{device}}:{{port}} transmit")),
        "Packets per second per port.", min=0),
    Panel("Port errors", "ops", tuple(
        Target(_ib(f"raypulse_node_infiniband_{name}_total"), "{{node}} {{device}}:{{port}} " + name)
        for name in ("symbol_errors", "receive_errors", "receive_remote_physical_errors", "transmit_discards",
                     "local_link_integrity_errors", "excessive_buffer_overrun_errors", "link_error_recovery",
                     "link_downed")),
        "Per second; any of these growing slows every collective that crosses the port.", width=16, min=0),
    Panel("Transmit wait", "ops", (Target(_ib("raypulse_node_infiniband_transmit_wait_total"),
                                          "{{node}} {{device}}:{{port}}"),),
          "Ticks per second the port had data but no credits to send (congestion).", min=0),
    Panel("Port state and rate", "short", (
        Target(S("raypulse_node_infiniband_port_state"), "{{node}} {{device}}:{{port}} state"),
        Target(S("raypulse_node_infiniband_port_physical_state"), "{{node}} {{device}}:{{port}} physical state")),
        "Logical state (4 = active) and physical state (5 = link up).", min=0),
    Panel("Port rate", "Bps", (Target(S("raypulse_node_infiniband_port_rate_bytes_per_second"),
                                      "{{node}} {{device}}:{{port}}"),), "Signalling rate of each port.", min=0),
    Panel("Hardware counters", "ops", (
        Target(f"sum by ({BY}, device, port, counter) ({rate(S('raypulse_node_infiniband_hw_counter_total'))})",
               "{{node}} {{device}}:{{port}} {{counter}}"),),
        "mlx5 hw_counters per second (out of sequence, timeouts, CNPs ...).", width=16, min=0),
    Panel("Ports", "short", (Target(S("raypulse_node_infiniband_port_info"), instant=True),),
          "Link layer, HCA, board and firmware of each port.", kind="table"),
))

POD = Row("Pod / container (cgroup)", (
    Panel("CPU used vs limit", "suffix: cores", (
        Target(rate(S("raypulse_pod_cpu_usage_seconds_total")), "{{node}} used"),
        Target(rate(S("raypulse_pod_cpu_user_seconds_total")), "{{node}} user"),
        Target(rate(S("raypulse_pod_cpu_system_seconds_total")), "{{node}} system"),
        Target(S("raypulse_pod_cpu_limit"), "{{node}} limit")),
        "CPUs the cgroup uses, and its quota (when it has one).", min=0),
    Panel("CPU throttling", "percentunit", (
        Target(f"{rate(S('raypulse_pod_cpu_throttled_periods_total'))} / {rate(S('raypulse_pod_cpu_periods_total'))}",
               "{{node}} throttled periods"),),
        "Share of scheduling periods in which the quota stopped the cgroup.", min=0, max=1),
    Panel("CPU time throttled", "s", (Target(rate(S("raypulse_pod_cpu_throttled_seconds_total")), "{{node}}"),),
          "Seconds per second the cgroup's tasks were held back by the quota.", min=0),
    Panel("Memory vs limit", "bytes", (
        *_series("raypulse_pod_memory_usage_bytes", "raypulse_pod_memory_working_set_bytes",
                 "raypulse_pod_memory_anonymous_bytes", "raypulse_pod_memory_file_bytes",
                 "raypulse_pod_memory_peak_bytes", "raypulse_pod_memory_swap_bytes"),
        Target(S("raypulse_pod_memory_limit_bytes"), "{{node}} limit")),
        "Working set is what the OOM killer compares with the limit.", width=16, min=0),
    Panel("Memory limit hits and OOM kills", "short", (
        Target(f"increase({S('raypulse_pod_memory_limit_hits_total')}[$__rate_interval])", "{{node}} limit hits"),
        Target(f"increase({S('raypulse_pod_memory_oom_kills_total')}[$__rate_interval])", "{{node}} OOM kills")),
        "Times the cgroup reached its memory limit, and processes the OOM killer ended in it.", min=0),
    Panel("Cgroup I/O", "Bps", _rates("raypulse_pod_io_read_bytes_total", "raypulse_pod_io_written_bytes_total"),
          "Bytes per second read and written by the cgroup.", min=0),
    Panel("Tasks vs limit", "short", _series("raypulse_pod_pids", "raypulse_pod_pids_limit"),
          "Tasks in the cgroup and its pids limit.", min=0),
    Panel("Pod", "short", (Target(S("raypulse_pod_info"), instant=True),),
          "Pod, namespace, container and cgroup of the exporter.", kind="table", width=16),
))

PROCESSES = Row("Processes and file descriptors", (
    Panel("Processes", "short", _series("raypulse_node_processes", "raypulse_node_processes_limit"),
          "Processes on the node and the kernel's pid_max.", min=0),
    Panel("Threads", "short", _series("raypulse_node_threads", "raypulse_node_threads_limit"),
          "Threads on the node and threads-max.", min=0),
    Panel("File descriptors", "short", _series("raypulse_node_file_descriptors",
                                               "raypulse_node_file_descriptors_limit"),
          "Allocated file handles and file-max.", min=0),
))

RAY = Row("Ray on this node", (
    Panel("Ray processes by job", "short", (
        Target(f"sum by ({BY}, submission_id, process_role) ({S('raypulse_job_processes')})",
               "{{node}} {{submission_id}} {{process_role}}"),),
        "Ray drivers, actors, workers and idle workers on the node by job (click: the job).", min=0,
        links=(to_job(),)),
    Panel("CPU of Ray processes", "suffix: cores", (
        Target(f"sum by ({BY}, submission_id, process_role) ({rate(S('raypulse_job_process_cpu_seconds_total'))})",
               "{{node}} {{submission_id}} {{process_role}}"),),
        "CPUs used by each job's processes on the node.", min=0, links=(to_job(),)),
    Panel("Memory of Ray processes", "bytes", (
        Target(f"sum by ({BY}, submission_id) ({S('raypulse_job_process_resident_memory_bytes')})",
               "{{node}} {{submission_id}} resident"),
        Target(f"sum by ({BY}, submission_id) ({S('raypulse_job_process_shared_memory_bytes')})",
               "{{node}} {{submission_id}} shared")),
        "Resident memory by job; shared pages (the object store) count in every process that maps them.", min=0),
    Panel("Object store", "bytes", tuple(
        Target(S(f"raypulse_ray_object_store_{name}_bytes"), "{{node}} " + name)
        for name in ("used", "capacity", "primary_copy", "fallback")),
        "Object store memory: in use, capacity, pinned primary copies, and objects that fell back to disk.",
        min=0),
    Panel("Objects in store", "short", (Target(S("raypulse_ray_object_store_objects"), "{{node}}"),),
          "Objects in the node's object store.", min=0),
    Panel("Spilling and restoring", "Bps", _rates(
        "raypulse_ray_object_store_spilled_bytes_total", "raypulse_ray_object_store_restored_bytes_total",
        "raypulse_ray_object_store_created_bytes_total"),
        "Bytes per second spilled to and restored from external storage, and created in the store.", min=0),
    Panel("Spill and restore operations", "ops", _rates(
        "raypulse_ray_object_store_spilled_objects_total", "raypulse_ray_object_store_restored_objects_total"),
        "Objects per second.", min=0),
    Panel("Time spent spilling", "percentunit", _rates(
        "raypulse_ray_object_store_spill_seconds_total", "raypulse_ray_object_store_restore_seconds_total"),
        "Seconds per second spent spilling and restoring.", min=0),
    Panel("Raylets", "short", (
        Target(S("raypulse_ray_local_raylets"), "{{node}} raylets"),
        Target(S("raypulse_ray_up"), "{{node}} dashboard reachable")),
        "Raylets the exporter watches on this host, and whether it reaches the Ray dashboard.", min=0),
    Panel("Ray node", "short", (Target(S("raypulse_ray_node_info"), instant=True),),
          "Ray node id, IP and role of each raylet on the host.", kind="table", width=16),
))

BOARD = Board(
    uid=UID_NODE, title="raypulse / Node and pod",
    description="One node or all: CPU, memory, pressure, disks, filesystems, network, TCP, InfiniBand, the "
                "pod's cgroup, processes, and what Ray runs there.",
    variables=("cluster", "node"), tags=("node",),
    rows=(OVERVIEW, CPU, MEMORY, PRESSURE, DISKS, FILESYSTEMS, NETWORK, TCP, INFINIBAND, POD, PROCESSES, RAY),
)
