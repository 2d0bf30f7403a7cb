"""Node and pod: memory pressure and OOM kills, CPU throttling, checkpoint volume and /dev/shm, InfiniBand.

Memory pressure and OOM kills also read node_exporter's series for nodes whose exporter runs in the
node-exporter-companion profile (exporter/profiles.py): the profile must not silence them.

Watched paths come from raypulse_node_filesystem_path_info{role}: `checkpoint` (the exporter's
--checkpoint-path) and `object_store` (Ray's plasma directory, /dev/shm by default); joining on
it keeps these alerts on the volumes that matter to a training job, whatever their fstype.
"""

from __future__ import annotations

from alerts.config import Config
from alerts.model import AT_NODE, Alert, Group, Record, cap
from exporter.contract import node_exporter as ne

AVAIL_RATIO = "mountpoint:raypulse_node_filesystem_avail_bytes:ratio"
SAME_TARGET = "on (job, instance, mountpoint)"


OOM_KILLS = ne.COUNTERS["raypulse_node_oom_kills_total"][0]
PRESSURE_STALLED = ne.PRESSURE_STALLED.format(resource="memory")


def _from_node_exporter(expr: str, ours: str) -> str:
    """`expr` on node_exporter's series, for the nodes whose exporter leaves memory to node_exporter
    (the node-exporter-companion profile): only nodes our /sd labelled, and none that has `ours`."""
    return (f"({expr}\n              and on ({ne.ON}) raypulse_exporter_build_info"
            f"\n              unless on ({ne.ON}) {ours})")


def _role(role: str) -> str:
    return f'{SAME_TARGET} raypulse_node_filesystem_path_info{{role="{role}"}}'


def group(c: Config) -> Group:
    t = c.tune
    fill, full, full_crit = (t("RaypulseCheckpointVolumeFillingUp"), t("RaypulseCheckpointVolumeAlmostFull"),
                             t("RaypulseCheckpointVolumeAlmostFull:critical"))
    shm, mem, ib = t("RaypulseNodeShmFillingUp"), t("RaypulseNodeMemoryPressure"), t("RaypulseNodeInfinibandPortErrors")
    ib_errors = " + ".join(f"increase(raypulse_node_infiniband_{name}_total[{ib.window}])" for name in (
        "symbol_errors", "receive_errors", "local_link_integrity_errors", "receive_remote_physical_errors",
        "excessive_buffer_overrun_errors"))
    checkpoint = "checkpoint volume {{ $labels.mountpoint }} on " + AT_NODE
    theirs_short = (f"({ne.MEMORY['raypulse_node_memory_available_bytes']} / "
                    f"{ne.MEMORY['raypulse_node_memory_total_bytes']} < {mem.available_ratio:g}"
                    f"\n                or rate({PRESSURE_STALLED}[{mem.window}]) > {mem.stalled_ratio:g})")
    theirs_oom = f'increase({OOM_KILLS}[{t("RaypulseNodeOomKills").window}]) > 0'
    return Group("node", "Node and pod (memory, OOM kills, CPU throttling, volumes, InfiniBand)", [
        Alert("RaypulseNodeMemoryPressure", "warning", "node", f"""
            raypulse_node_memory_available_bytes / raypulse_node_memory_total_bytes < {mem.available_ratio:g}
            or
            max without (resource) (
              rate(raypulse_node_pressure_stalled_seconds_total{{resource="memory"}}[{mem.window}])
            ) > {mem.stalled_ratio:g}
            or
            {_from_node_exporter(theirs_short, "raypulse_node_memory_total_bytes")}
            """,
              "A node is short of memory.",
              f"{cap(AT_NODE)} has less than {mem.available_ratio:.0%} of its memory available, or all its tasks "
              f"stalled on memory more than {mem.stalled_ratio:.0%} of the time."),
        Alert("RaypulseNodeOomKills", "warning", "node", f"""
            increase(raypulse_node_oom_kills_total[{t("RaypulseNodeOomKills").window}]) > 0
            or
            {_from_node_exporter(theirs_oom, "raypulse_node_oom_kills_total")}
            """,
              "The kernel OOM killer killed processes on a node.",
              f"The kernel killed {{{{ $value | printf \"%.0f\" }}}} processes for lack of memory on {AT_NODE} "
              f"in the last {t('RaypulseNodeOomKills').window}."),
        Alert("RaypulsePodOomKills", "warning", "node", f"""
            increase(raypulse_pod_memory_oom_kills_total[{t("RaypulsePodOomKills").window}]) > 0
            """,
              "The OOM killer killed processes of a pod or container.",
              f"The OOM killer killed {{{{ $value | printf \"%.0f\" }}}} processes of the pod or container on "
              f"{AT_NODE} in the last {t('RaypulsePodOomKills').window} (memory limit reached)."),
        Alert("RaypulsePodMemoryNearLimit", "warning", "node", f"""
            raypulse_pod_memory_working_set_bytes / raypulse_pod_memory_limit_bytes
              > {t("RaypulsePodMemoryNearLimit").ratio:g}
            """,
              "A pod or container is close to its memory limit.",
              f"The pod or container on {AT_NODE} uses {{{{ $value | humanizePercentage }}}} of its memory "
              "limit; the OOM killer acts at 100%."),
        Alert("RaypulsePodCpuThrottled", "warning", "node", f"""
            rate(raypulse_pod_cpu_throttled_periods_total[{t("RaypulsePodCpuThrottled").window}])
              / rate(raypulse_pod_cpu_periods_total[{t("RaypulsePodCpuThrottled").window}])
              > {t("RaypulsePodCpuThrottled").ratio:g}
            """,
              "A pod or container is throttled by its CPU limit.",
              f"The pod or container on {AT_NODE} was throttled in {{{{ $value | humanizePercentage }}}} of its "
              "CPU periods; data loading and the Ray workers slow down."),
        Record(AVAIL_RATIO, "raypulse_node_filesystem_avail_bytes / raypulse_node_filesystem_size_bytes"),
        Alert("RaypulseCheckpointVolumeFillingUp", "warning", "node", f"""
            (
              {AVAIL_RATIO} < {fill.free_ratio:g}
              and predict_linear(raypulse_node_filesystem_avail_bytes[{fill.window}], {fill.horizon.seconds}) < 0
              and raypulse_node_filesystem_readonly == 0
            )
            and {_role("checkpoint")}
            """,
              "A checkpoint volume is predicted to fill up.",
              f"The {checkpoint} has {{{{ $value | humanizePercentage }}}} free and, at the rate of the last "
              f"{fill.window}, fills up within {fill.horizon}."),
        Alert("RaypulseCheckpointVolumeAlmostFull", "warning", "node", f"""
            {AVAIL_RATIO} < {full.free_ratio:g} and {_role("checkpoint")}
            """,
              "A checkpoint volume is almost full.",
              f"The {checkpoint} has only {{{{ $value | humanizePercentage }}}} free."),
        Alert("RaypulseCheckpointVolumeAlmostFull", "critical", "node", f"""
            {AVAIL_RATIO} < {full_crit.free_ratio:g} and {_role("checkpoint")}
            """,
              "A checkpoint volume is almost full.",
              f"The {checkpoint} has only {{{{ $value | humanizePercentage }}}} free.",
              tuning_key="RaypulseCheckpointVolumeAlmostFull:critical"),
        Alert("RaypulseCheckpointVolumeUnavailable", "critical", "node", f"""
            (raypulse_node_filesystem_device_error == 1 or raypulse_node_filesystem_readonly == 1)
            and {_role("checkpoint")}
            """,
              "A checkpoint volume cannot be written.",
              f"The {checkpoint} is read-only, or statvfs on it fails or hangs (a hung network mount)."),
        Alert("RaypulseNodeShmFillingUp", "warning", "node", f"""
            (
              {AVAIL_RATIO} < {shm.free_ratio:g}
              and predict_linear(raypulse_node_filesystem_avail_bytes[{shm.window}], {shm.horizon.seconds}) < 0
            )
            and {_role("object_store")}
            """,
              "Ray's shared-memory object store volume is predicted to fill up.",
              "The object store volume {{ $labels.mountpoint }} on " + AT_NODE +
              f" has {{{{ $value | humanizePercentage }}}} free and fills up within {shm.horizon}; "
              "Ray then spills objects to disk or fails allocations."),
        Alert("RaypulseNodeInfinibandPortErrors", "warning", "node", f"""
            {ib_errors}
              > {ib.errors:g}
            or
            increase(raypulse_node_infiniband_link_downed_total[{ib.window}]) > 0
            """,
              "An InfiniBand or RoCE port shows link errors.",
              "Port {{ $labels.device }}/{{ $labels.port }} on " + AT_NODE +
              f" counted {{{{ $value | humanize }}}} link errors (or went down) in the last {ib.window}; "
              "collectives over it slow down or hang."),
    ])
