"""GPU health: XIDs, lost GPUs, ECC and row remapping, NVLink, thermal and power slowdowns, PCIe, NVML.

Every expression reads raypulse_gpu_* series, which a node without an NVIDIA driver never has
(it reports raypulse_gpu_nvml_up 0 with error="library_not_found"), so none of these can fire
on a CPU-only node; RaypulseGpuNvmlDown excludes that case explicitly.
"""

from __future__ import annotations

from alerts.config import Config
from alerts.model import AT_GPU, AT_NODE, GPU, Alert, Group, Record, cap, increased

LINKS_UP = "gpu:raypulse_gpu_nvlink_links_up:sum"


def group(c: Config) -> Group:
    xids = "|".join(str(code) for code in c.critical_xids)
    t = c.tune
    return Group("gpu", "GPU health (NVML, XID events, ECC, NVLink, PCIe, clocks)", [
        Alert("RaypulseGpuXidCritical", "critical", "gpu", f"""
            time() - raypulse_gpu_xid_last_timestamp_seconds{{xid=~"{xids}"}}
              < {t("RaypulseGpuXidCritical").window.seconds}
            """,
              "A GPU reported an XID error that needs a GPU reset or hardware service.",
              f"{AT_GPU} reported XID {{{{ $labels.xid }}}} {{{{ $value | humanizeDuration }}}} ago."),
        Alert("RaypulseGpuXidError", "warning", "gpu", f"""
            time() - raypulse_gpu_xid_last_timestamp_seconds{{xid!~"{xids}"}}
              < {t("RaypulseGpuXidError").window.seconds}
            """,
              "A GPU reported an XID error.",
              f"{AT_GPU} reported XID {{{{ $labels.xid }}}} {{{{ $value | humanizeDuration }}}} ago; "
              "most such XIDs point at the application (a bad kernel or memory access)."),
        Alert("RaypulseGpuLost", "critical", "gpu", "raypulse_gpu_up == 0",
              "A GPU stopped answering (fallen off the bus or waiting for a reset).",
              f"{AT_GPU} no longer answers NVML (GPU_IS_LOST or not enumerated); its work has failed."),
        Alert("RaypulseGpuCountLow", "critical", "gpu", f"""
            raypulse_gpu_devices < max_over_time(raypulse_gpu_devices[{t("RaypulseGpuCountLow").history}])
            or
            raypulse_gpu_devices
              < on (cluster, ray_node_id) group_left ()
                max by (cluster, ray_node_id) (
                  label_replace(raypulse_ray_node_resource_capacity{{resource="GPU"}},
                                "ray_node_id", "$1", "node_id", "(.+)")
                )
            """,
              "A node enumerates fewer GPUs than it had or than Ray schedules on it.",
              f"{cap(AT_NODE)} enumerates {{{{ $value }}}} GPUs, fewer than in the last "
              f"{t('RaypulseGpuCountLow').history} or than the GPUs Ray counts on it."),
        Alert("RaypulseGpuDoubleBitEccErrors", "critical", "gpu",
              increased('raypulse_gpu_ecc_errors_total{type="uncorrected"}', t("RaypulseGpuDoubleBitEccErrors").window,
                        c.up),
              "A GPU had uncorrectable (double-bit) ECC errors.",
              f"{AT_GPU} counted new uncorrectable ECC errors in the last "
              f"{t('RaypulseGpuDoubleBitEccErrors').window}: data in GPU memory was lost."),
        Alert("RaypulseGpuCorrectedEccErrorsHigh", "warning", "gpu", f"""
            increase(raypulse_gpu_ecc_errors_total{{type="corrected"}}[{t("RaypulseGpuCorrectedEccErrorsHigh").window}])
              > {t("RaypulseGpuCorrectedEccErrorsHigh").errors:g}
            """,
              "A GPU corrects single-bit ECC errors at a high rate.",
              f"{AT_GPU} corrected {{{{ $value | humanize }}}} single-bit ECC errors in the last "
              f"{t('RaypulseGpuCorrectedEccErrorsHigh').window}; a rising rate precedes uncorrectable errors."),
        Alert("RaypulseGpuRowRemapPending", "warning", "gpu", """
            raypulse_gpu_row_remap_pending == 1 or raypulse_gpu_retired_pages_pending == 1
            """,
              "A GPU has memory rows or pages waiting for a GPU reset to be remapped.",
              f"{AT_GPU} has a pending row remap (or page retirement); it takes effect at the next GPU reset."),
        Alert("RaypulseGpuRowRemapFailed", "critical", "gpu", "raypulse_gpu_row_remap_failed == 1",
              "A GPU failed to remap a memory row and should be replaced.",
              f"{AT_GPU} could not remap a failing memory row: it has no spare rows left in that bank."),
        Alert("RaypulseGpuRecoveryActionRequired", "critical", "gpu", "raypulse_gpu_recovery_action > 0",
              "The GPU driver asks for a recovery action.",
              f"{AT_GPU} asks for recovery action {{{{ $value }}}} (1 GPU reset, 2 node reboot, "
              "3 drain peer-to-peer, 4 drain and reset, 6 bus reset)."),
        Record(LINKS_UP, f"sum by ({GPU}) (raypulse_gpu_nvlink_link_up)"),
        Alert("RaypulseGpuNvlinkDown", "critical", "gpu", f"""
            {LINKS_UP}
              < on (cluster, node, instance) group_left ()
                max by (cluster, node, instance) ({LINKS_UP})
            or
            {LINKS_UP} < max_over_time({LINKS_UP}[{t("RaypulseGpuNvlinkDown").history}])
            """,
              "A GPU has fewer NVLink links up than its peers or than it had.",
              f"{AT_GPU} has {{{{ $value }}}} NVLink links up, fewer than another GPU of the node or than in "
              f"the last {t('RaypulseGpuNvlinkDown').history}."),
        Alert("RaypulseGpuNvlinkErrors", "warning", "gpu", f"""
            sum by ({GPU}) (
              increase(raypulse_gpu_nvlink_errors_total{{type=~"crc_data|ecc_data|replay"}}[{t("RaypulseGpuNvlinkErrors").window}])
            ) > {t("RaypulseGpuNvlinkErrors").errors:g}
            or
            sum by ({GPU}) (
              increase(raypulse_gpu_nvlink_errors_total{{type="recovery"}}[{t("RaypulseGpuNvlinkErrors").window}])
            ) > 0
            """,
              "A GPU's NVLink links show data errors or link recoveries.",
              f"{AT_GPU} counted {{{{ $value | humanize }}}} NVLink errors in the last "
              f"{t('RaypulseGpuNvlinkErrors').window} (data CRC/ECC errors and replays, or link recoveries)."),
        Alert("RaypulseGpuThermalSlowdown", "warning", "gpu", f"""
            max by ({GPU}) (
              rate(raypulse_gpu_clock_event_seconds_total{{reason=~"sw_thermal_slowdown|hw_thermal_slowdown"}}[{t("RaypulseGpuThermalSlowdown").window}])
              or
              rate(raypulse_gpu_violation_seconds_total{{policy="thermal"}}[{t("RaypulseGpuThermalSlowdown").window}])
            ) > {t("RaypulseGpuThermalSlowdown").ratio:g}
            """,
              "A GPU is slowed down because it is too hot.",
              f"{AT_GPU} had its clocks held down by a thermal slowdown {{{{ $value | humanizePercentage }}}} "
              f"of the last {t('RaypulseGpuThermalSlowdown').window}."),
        Alert("RaypulseGpuPowerBrakeSlowdown", "warning", "gpu", f"""
            rate(raypulse_gpu_clock_event_seconds_total{{reason="hw_power_brake_slowdown"}}[{t("RaypulseGpuPowerBrakeSlowdown").window}])
              > {t("RaypulseGpuPowerBrakeSlowdown").ratio:g}
            """,
              "A GPU is slowed down by the hardware power brake.",
              f"{AT_GPU} had its clocks held down by the power brake (an external signal, e.g. a failing "
              f"power supply) {{{{ $value | humanizePercentage }}}} of the last "
              f"{t('RaypulseGpuPowerBrakeSlowdown').window}."),
        Alert("RaypulseGpuPcieLinkDegraded", "warning", "gpu", f"""
            raypulse_gpu_pcie_link_width < raypulse_gpu_pcie_link_max_width
            or
            (
              raypulse_gpu_pcie_link_generation < raypulse_gpu_pcie_link_max_generation
              and raypulse_gpu_utilization_ratio > {t("RaypulseGpuPcieLinkDegraded").busy_ratio:g}
            )
            """,
              "A GPU's PCIe link runs narrower or slower than it can.",
              f"{AT_GPU} runs its PCIe link with fewer lanes than it supports, or at a lower generation "
              "while busy (links may only train down when idle)."),
        Alert("RaypulseGpuNvmlDown", "warning", "gpu", """
            raypulse_gpu_nvml_up == 0
            unless on (job, instance) raypulse_gpu_nvml_init_failures_total{error="library_not_found"}
            """,
              "NVML cannot be initialized on a GPU node.",
              f"The exporter on {AT_NODE} cannot initialize NVML (the driver is installed but does not "
              "answer); its GPUs are not monitored."),
        Alert("RaypulseGpuNvmlCallFailing", "warning", "gpu", f"""
            sum by (cluster, node, instance, job, call, error) (
              rate(raypulse_gpu_nvml_errors_total{{error!="gpu_is_lost"}}[{t("RaypulseGpuNvmlCallFailing").window}])
            ) > 0
            """,
              "An NVML call keeps failing; the series it feeds are missing.",
              f"On {AT_NODE}, NVML call {{{{ $labels.call }}}} keeps failing with {{{{ $labels.error }}}}; "
              "the metrics it provides are omitted."),
    ])
