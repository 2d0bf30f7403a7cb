"""GPU: one GPU or all, every raypulse_gpu_* family. dcgm-exporter's dashboard shows temperature,
power, clocks and utilization only; the health rows here (XIDs, ECC, row remapping, NVLink, PCIe,
clock events) are what tells a slow or failing GPU from a slow job."""

from __future__ import annotations

from dashboards.boards.common import UID_GPU, rate, to_job
from dashboards.model import Board, Panel, Row, Target
from dashboards.selectors import Scope

S = Scope("cluster", "node", "gpu")
ID = "{{node}} GPU {{gpu}}"
BY = "cluster, node, gpu"


def _each(name: str, *matchers: str, legend: str = ID, **equals: str) -> Target:
    return Target(S(name, *matchers, **equals), legend)


def _rate(name: str, by: str = "") -> Target:
    extra = f", {by}" if by else ""
    return Target(f"sum by ({BY}{extra}) ({rate(S(name))})", ID + (f" {{{{{by}}}}}" if by else ""))


HEALTH = (None, "green"), (0.5, "red")

OVERVIEW = Row("Overview", collapsed=False, panels=(
    Panel("GPUs answering", "short", (
        Target(f"sum({S('raypulse_gpu_up')})", "answering"),
        Target(f"sum({S('raypulse_gpu_up')} == bool 0)", "lost")),
        "GPUs that answer NVML, and GPUs enumerated once that no longer do (fallen off the bus).",
        kind="stat", width=4, height=5),
    Panel("NVML up", "bool", (Target(S("raypulse_gpu_nvml_up"), "{{node}}"),),
          "0: the node's NVML could not be initialised (driver missing or broken); GPU series are absent.",
          kind="stat", width=4, height=5, mappings=(("0", "down", "red"), ("1", "up", "green"))),
    Panel("GPUs per node", "short", (Target(S("raypulse_gpu_devices"), "{{node}}"),),
          "GPUs NVML enumerates on each node.", kind="stat", width=4, height=5),
    Panel("XIDs since exporter start", "short", (
        Target(f"sum by ({BY}, xid) ({S('raypulse_gpu_xid_errors_total')})", ID + " XID {{xid}}"),),
        "XID errors each GPU reported (79: fell off the bus; 48, 94, 95: uncorrectable ECC; 13, 31, 43: "
        "usually the application).", kind="stat", width=6, height=5, thresholds=HEALTH),
    Panel("Simulated", "short", (Target(f"count by (node, simulated) ({S('raypulse_gpu_nvml_info')})",
                                        "{{node}} simulated={{simulated}}"),),
          "Simulated GPUs (exporter --simulate-gpus) say so here and on every raypulse_gpu_info series.",
          kind="stat", width=6, height=5),
    Panel("Utilization", "percentunit", (_each("raypulse_gpu_utilization_ratio"),),
          "Share of time a kernel ran (NVML utilization; coarse: one tiny kernel counts as busy).",
          width=6, min=0, max=1),
    Panel("Memory used", "percentunit", (
        Target(f"{S('raypulse_gpu_memory_used_bytes')} / {S('raypulse_gpu_memory_total_bytes')}", ID),),
        "Framebuffer memory in use.", width=6, min=0, max=1),
    Panel("Temperature", "celsius", (_each("raypulse_gpu_temperature_celsius", sensor="gpu"),),
          "GPU core temperature.", width=6, thresholds=((None, "green"), (83, "orange"), (87, "red"))),
    Panel("Power draw", "watt", (_each("raypulse_gpu_power_usage_watts"),), "Board power draw (NVML average).",
          width=6, min=0),
    Panel("Inventory", "short", (Target(S("raypulse_gpu_info"), instant=True),),
          "Model, PCI bus id, serial, VBIOS, driver and CUDA versions of every GPU enumerated.", kind="table",
          width=24, height=7),
))

ACTIVITY = Row("Utilization and activity", (
    Panel("SM activity and occupancy", "percentunit", (
        _each("raypulse_gpu_sm_active_ratio", legend=ID + " SM active"),
        _each("raypulse_gpu_sm_occupancy_ratio", legend=ID + " SM occupancy")),
        "Share of SMs busy, and of warps resident (GPM, Hopper and newer): the honest utilization.",
        min=0, max=1),
    Panel("Tensor cores", "percentunit", (
        _each("raypulse_gpu_tensor_active_ratio", legend=ID + " tensor"),
        Target(S("raypulse_gpu_tensor_pipe_active_ratio"), ID + " {{pipe}}")),
        "Tensor pipe activity overall and per pipe (HMMA, IMMA, DMMA, DFMA).", min=0, max=1),
    Panel("FP and integer pipes", "percentunit", (
        Target(S("raypulse_gpu_fp_pipe_active_ratio"), ID + " {{precision}}"),
        _each("raypulse_gpu_integer_pipe_active_ratio", legend=ID + " integer")),
        "FP64/FP32/FP16 and integer pipe activity.", min=0, max=1),
    Panel("Memory activity", "percentunit", (
        _each("raypulse_gpu_dram_active_ratio", legend=ID + " DRAM active (GPM)"),
        _each("raypulse_gpu_memory_bandwidth_utilization_ratio", legend=ID + " memory busy (NVML)")),
        "Share of memory bandwidth in use.", min=0, max=1),
    Panel("Graphics engine", "percentunit", (_each("raypulse_gpu_graphics_engine_active_ratio"),),
          "Graphics or compute engine active (GPM).", min=0, max=1),
    Panel("Video engines", "percentunit", (
        _each("raypulse_gpu_encoder_utilization_ratio", legend=ID + " encoder"),
        _each("raypulse_gpu_decoder_utilization_ratio", legend=ID + " decoder")),
        "NVENC and NVDEC utilization (GPUs that have them).", min=0, max=1),
    Panel("GPM supported", "bool", (_each("raypulse_gpu_gpm_supported"),),
          "1 where GPU performance monitoring (the *_active ratios) is available.", kind="stat",
          mappings=(("0", "no", "text"), ("1", "yes", "green"))),
))

MEMORY = Row("Memory", (
    Panel("Framebuffer memory", "bytes", (
        _each("raypulse_gpu_memory_used_bytes", legend=ID + " used"),
        _each("raypulse_gpu_memory_free_bytes", legend=ID + " free"),
        _each("raypulse_gpu_memory_reserved_bytes", legend=ID + " reserved"),
        _each("raypulse_gpu_memory_total_bytes", legend=ID + " total")),
        "Used, free, reserved by the driver, and total.", width=12, min=0),
    Panel("BAR1 memory", "bytes", (
        _each("raypulse_gpu_bar1_memory_used_bytes", legend=ID + " used"),
        _each("raypulse_gpu_bar1_memory_total_bytes", legend=ID + " total")),
        "BAR1 aperture (GPUDirect RDMA and peer mappings).", width=12, min=0),
))

CLOCKS = Row("Clocks and throttling", (
    Panel("Clocks", "hertz", (
        Target(S("raypulse_gpu_clock_hertz"), ID + " {{clock}}"),
        Target(S("raypulse_gpu_clock_max_hertz", clock="sm"), ID + " sm max")),
        "Current clocks, and the SM clock's maximum: a gap under load is throttling.", min=0),
    Panel("Clock events active", "short", (
        Target(f"{S('raypulse_gpu_clock_event_active')} > 0", ID + " {{reason}}"),
        Target(f"sum by ({BY}) ({S('raypulse_gpu_clock_event_active')})", ID + " reasons active")),
        "Why the clocks are held down right now (thermal, power brake, power cap, idle ...).", min=0),
    Panel("Time in clock events", "percentunit", (_rate("raypulse_gpu_clock_event_seconds_total", "reason"),),
          "Share of time each clock event reason held the clocks down.", min=0, max=1),
    Panel("Violation time", "percentunit", (_rate("raypulse_gpu_violation_seconds_total", "policy"),),
          "Share of time below the requested clocks by policy (power, thermal, reliability ...). Do not "
          "alert on this being > 0: healthy GPUs accumulate it.", min=0, max=1),
    Panel("Performance state", "short", (_each("raypulse_gpu_performance_state"),),
          "P-state: 0 is maximum performance, higher is slower.", min=0),
))

THERMAL = Row("Temperature and power", (
    Panel("Temperatures", "celsius", (
        Target(S("raypulse_gpu_temperature_celsius"), ID + " {{sensor}}"),
        Target(f"min by ({BY}, threshold) ({S('raypulse_gpu_temperature_threshold_celsius')})",
               ID + " {{threshold}} threshold")),
        "Core and memory (HBM) temperatures and the GPU's thresholds (slowdown, shutdown ...).", width=12),
    Panel("Thermal margin", "celsius", (_each("raypulse_gpu_thermal_margin_celsius"),),
          "Degrees left before thermal slowdown; below 0 the GPU throttles.",
          thresholds=((None, "red"), (5, "orange"), (10, "green"))),
    Panel("Fan speed", "percentunit", (Target(S("raypulse_gpu_fan_speed_ratio"), ID + " fan {{fan}}"),),
          "Boards with their own fans (not SXM).", min=0, max=1),
    Panel("Power against limits", "watt", (
        _each("raypulse_gpu_power_usage_watts", legend=ID + " average"),
        _each("raypulse_gpu_power_instant_watts", legend=ID + " instant"),
        _each("raypulse_gpu_power_limit_watts", legend=ID + " limit"),
        Target(S("raypulse_gpu_power_limit_bound_watts"), ID + " {{bound}} limit")),
        "Draw against the enforced limit and its bounds.", width=12, min=0),
    Panel("Energy", "watt", (Target(rate(S("raypulse_gpu_energy_joules_total")), ID),),
          "Average power from the energy counter.", min=0),
    Panel("Energy used in range", "joule", (
        Target(f"sum by ({BY}) (increase({S('raypulse_gpu_energy_joules_total')}[$__range]))", ID),),
        "Energy each GPU used over the dashboard's time range.", kind="bargauge", min=0),
))

ERRORS = Row("Errors and health", collapsed=False, panels=(
    Panel("XID errors", "short", (
        Target(f"sum by ({BY}, xid) ({S('raypulse_gpu_xid_errors_total')})", ID + " XID {{xid}}"),),
        "XID errors counted since the exporter started, by code.", min=0, thresholds=HEALTH),
    Panel("Last XID", "s", (
        Target(f"time() - {S('raypulse_gpu_xid_last_timestamp_seconds')}", ID + " XID {{xid}}"),),
        "Time since each GPU last reported each XID.", kind="table"),
    Panel("NVML events", "short", (
        Target(f"sum by ({BY}, type) ({S('raypulse_gpu_events_total')})", ID + " {{type}}"),),
        "Events NVML delivered: XIDs, ECC errors, GPU unavailable, recovery actions.", min=0),
    Panel("ECC errors (since driver load)", "short", (
        Target(S("raypulse_gpu_ecc_errors_total"), ID + " {{type}}"),),
        "Volatile ECC error counts; any uncorrected error means the job's data may be wrong.", min=0,
        thresholds=HEALTH),
    Panel("ECC errors (lifetime)", "short", (
        Target(S("raypulse_gpu_ecc_lifetime_errors_total"), ID + " {{type}}"),),
        "Aggregate ECC error counts over the board's life.", min=0),
    Panel("ECC errors by location", "short", (
        Target(f"{S('raypulse_gpu_ecc_location_errors_total')} > 0", ID + " {{type}} {{location}}"),
        Target(f"sum by ({BY}) ({S('raypulse_gpu_ecc_location_errors_total')})", ID + " all locations")),
        "Where ECC errors happened (device memory, SRAM, register file ...).", min=0),
    Panel("ECC mode", "bool", (Target(S("raypulse_gpu_ecc_mode_enabled", state="current"), ID),),
          "1 while ECC is on.", kind="stat", mappings=(("0", "off", "orange"), ("1", "on", "green"))),
    Panel("Row remapping", "short", (
        Target(S("raypulse_gpu_remapped_rows"), ID + " remapped ({{cause}})"),
        _each("raypulse_gpu_row_remap_pending", legend=ID + " remap pending (reset needed)"),
        _each("raypulse_gpu_row_remap_failed", legend=ID + " remap failed (replace)")),
        "Rows remapped after ECC errors; pending needs a GPU reset, failed needs the board replaced.", min=0),
    Panel("Row remap bank availability", "short", (
        Target(S("raypulse_gpu_row_remap_bank_availability"), ID + " {{level}}"),),
        "Banks by how many spare rows they have left; banks at 'none' cannot remap again.", min=0),
    Panel("Retired pages", "short", (
        Target(S("raypulse_gpu_retired_pages"), ID + " {{cause}}"),
        _each("raypulse_gpu_retired_pages_pending", legend=ID + " retirement pending")),
        "Pages retired after ECC errors (GPUs before Ampere).", min=0),
    Panel("Recovery action", "short", (_each("raypulse_gpu_recovery_action"),),
          "What the driver asks for: 0 none, 1 GPU reset, 2 node reboot, 3 drain peers, 4 drain and reset.",
          kind="stat", mappings=(("0", "none", "green"), ("1", "GPU reset", "red"), ("2", "node reboot", "red"),
                                 ("3", "drain peers", "orange"), ("4", "drain and reset", "red"))),
    Panel("GPU up / lost", "short", (
        _each("raypulse_gpu_up", legend=ID + " up"),
        Target(f"sum by ({BY}) ({S('raypulse_gpu_lost_events_total')})", ID + " times lost")),
        "1 while the GPU answers; times it was lost since the exporter started.", min=0),
))

NVLINK = Row("NVLink", (
    Panel("NVLink throughput", "Bps", (
        Target(f"sum by ({BY}, direction) ({S('raypulse_gpu_nvlink_link_throughput_bytes_per_second')})",
               ID + " {{direction}}"),
        _rate("raypulse_gpu_nvlink_bytes_total", "direction")),
        "Data over all links per direction (NVML throughput, and the byte counter's rate).", min=0),
    Panel("NVLink raw traffic", "Bps", (_rate("raypulse_gpu_nvlink_raw_bytes_total", "direction"),),
          "Bytes on the wire including protocol overhead.", min=0),
    Panel("NVLink packets", "pps", (_rate("raypulse_gpu_nvlink_packets_total", "direction"),),
          "Packets per second (NVLink5).", min=0),
    Panel("Links up", "short", (
        Target(f"sum by ({BY}) ({S('raypulse_gpu_nvlink_link_up')})", ID + " up"),
        _each("raypulse_gpu_nvlink_links", legend=ID + " links")),
        "Active links against the GPU's link count; fewer is a degraded all-reduce.", min=0),
    Panel("Links down", "short", (
        Target(f"{S('raypulse_gpu_nvlink_link_up')} == 0", ID + " link {{link}}"),),
        "Each inactive link.", kind="table"),
    Panel("Link speed", "Bps", (_each("raypulse_gpu_nvlink_link_speed_bytes_per_second"),),
          "Per-link speed.", min=0),
    Panel("NVLink errors", "ops", (
        _rate("raypulse_gpu_nvlink_errors_total", "type"),
        _rate("raypulse_gpu_nvlink_packet_errors_total", "type")),
        "CRC, replay, recovery and ECC errors per second, and NVLink5 packet errors.", width=12, min=0),
    Panel("NVLink errors by link", "short", (
        Target(f"sum by ({BY}, link, type) ({S('raypulse_gpu_nvlink_link_errors_total')}) > 0",
               ID + " link {{link}} {{type}}"),
        Target(f"sum by ({BY}, type) ({S('raypulse_gpu_nvlink_link_errors_total')})", ID + " {{type}} (all links)")),
        "Error counts per link (links that have any) and over all links.", min=0),
    Panel("NVLink recoveries", "short", (
        Target(S("raypulse_gpu_nvlink_recovery_events_total"), ID + " {{result}}"),),
        "Link recovery events by result (NVLink5).", min=0),
    Panel("Fabric", "short", (
        _each("raypulse_gpu_fabric_state", legend=ID + " state"),
        _each("raypulse_gpu_fabric_status_ok", legend=ID + " status ok")),
        "NVSwitch fabric registration: state 3 = completed; status ok 1.", min=0),
))

PCIE = Row("PCIe", (
    Panel("PCIe throughput", "Bps", (
        Target(S("raypulse_gpu_pcie_throughput_bytes_per_second"), ID + " {{direction}}"),
        _rate("raypulse_gpu_pcie_bytes_total", "direction")),
        "Host-GPU traffic per direction (NVML sample, and the byte counter's rate).", min=0),
    Panel("PCIe link", "short", (
        _each("raypulse_gpu_pcie_link_generation", legend=ID + " generation"),
        _each("raypulse_gpu_pcie_link_max_generation", legend=ID + " max generation"),
        _each("raypulse_gpu_pcie_link_width", legend=ID + " width"),
        _each("raypulse_gpu_pcie_link_max_width", legend=ID + " max width")),
        "Current link against its maximum: a GPU trained at a lower width or generation is slow.", min=0),
    Panel("PCIe replays and recoveries", "short", (
        _each("raypulse_gpu_pcie_replays_total", legend=ID + " replays"),
        _each("raypulse_gpu_pcie_replay_rollovers_total", legend=ID + " replay rollovers"),
        _each("raypulse_gpu_pcie_l0_to_recovery_total", legend=ID + " L0 to recovery")),
        "Counts since the driver loaded; a growing count is a marginal link.", min=0),
    Panel("PCIe errors", "short", (Target(S("raypulse_gpu_pcie_errors_total"), ID + " {{type}}"),),
          "AER and link error counters by type.", min=0),
))

JOBS = Row("Processes and jobs", collapsed=False, panels=(
    Panel("Jobs on the GPU: memory", "bytes", (
        Target(S("raypulse_job_gpu_memory_used_bytes"), ID + " {{submission_id}}"),),
        "GPU memory held by each Ray job's processes (click: the job).", min=0, links=(to_job(),)),
    Panel("Jobs on the GPU: SM time", "percentunit", (
        Target(S("raypulse_job_gpu_sm_utilization_ratio"), ID + " {{submission_id}}"),
        Target(S("raypulse_job_gpu_processes"), ID + " {{submission_id}} processes")),
        "Share of SM time each job's processes used, and how many of its processes use the GPU.", min=0,
        links=(to_job(),)),
    Panel("Processes on the GPU", "short", (
        _each("raypulse_gpu_processes"),
        Target(S("raypulse_gpu_processes_unlisted"), "{{node}} without per-process series")),
        "Compute processes NVML lists on the GPU (any owner), and those of the node left out of the per-process "
        "series (gpu.max_process_series).", min=0),
    Panel("Process memory", "bytes", (
        Target(f"{S('raypulse_gpu_process_memory_used_bytes')} * on (instance, uuid, pid) group_left (process_name) "
               f"{S('raypulse_gpu_process_info')}", ID + " {{process_name}} ({{pid}})"),),
        "GPU memory per process.", min=0),
    Panel("Process SM and memory utilization", "percentunit", (
        Target(S("raypulse_gpu_process_sm_utilization_ratio"), ID + " pid {{pid}} SM"),
        Target(S("raypulse_gpu_process_memory_bandwidth_utilization_ratio"), ID + " pid {{pid}} memory")),
        "Per-process utilization over NVML's last sample period.", min=0, max=1),
    Panel("Compute and persistence mode", "short", (
        _each("raypulse_gpu_compute_mode", legend=ID + " compute mode"),
        _each("raypulse_gpu_persistence_mode_enabled", legend=ID + " persistence mode")),
        "Compute mode (0 default, 2 prohibited, 3 exclusive process) and persistence mode.", kind="table"),
))

MIG = Row("MIG", (
    Panel("MIG mode", "short", (Target(S("raypulse_gpu_mig_mode_enabled"), ID + " {{state}}"),),
          "1 where MIG is on (current) or will be after a reset (pending).", min=0),
    Panel("MIG instances", "short", (Target(S("raypulse_gpu_mig_instance_info"), instant=True),),
          "GPU and compute instances and their profiles.", kind="table", width=16),
    Panel("MIG memory", "bytes", (
        Target(S("raypulse_gpu_mig_memory_used_bytes"), ID + " GI {{gpu_instance_id}} used"),
        Target(S("raypulse_gpu_mig_memory_total_bytes"), ID + " GI {{gpu_instance_id}} total")),
        "Memory per GPU instance.", min=0),
    Panel("MIG activity", "percentunit", (
        Target(S("raypulse_gpu_mig_sm_active_ratio"), ID + " GI {{gpu_instance_id}} SM"),
        Target(S("raypulse_gpu_mig_tensor_active_ratio"), ID + " GI {{gpu_instance_id}} tensor"),
        Target(S("raypulse_gpu_mig_dram_active_ratio"), ID + " GI {{gpu_instance_id}} DRAM")),
        "GPM activity per GPU instance (Hopper and newer).", width=16, min=0, max=1),
))

COLLECTOR = Row("Collection", (
    Panel("Collection time per GPU", "s", (_each("raypulse_gpu_collection_duration_seconds"),),
          "Time the exporter spent reading each GPU; a GPU that is slow to answer is a warning sign.", min=0),
    Panel("NVML errors", "ops", (
        Target(f"sum by (cluster, node, call, error) ({rate(S('raypulse_gpu_nvml_errors_total'))})",
               "{{node}} {{call}} {{error}}"),
        Target(f"sum by (cluster, node, error) ({rate(S('raypulse_gpu_nvml_init_failures_total'))})",
               "{{node}} init {{error}}")),
        "NVML calls that failed, and failed NVML initialisations, per second.", min=0),
    Panel("Unsupported NVML calls", "short", (
        Target(f"count by (cluster, node, call) ({S('raypulse_gpu_nvml_call_unsupported')})", "{{node}} {{call}}"),),
        "Calls a GPU answers NOT_SUPPORTED; their series are left out, never reported as 0.", kind="table"),
    Panel("Event watcher", "short", (
        Target(S("raypulse_gpu_event_watcher_up"), "{{node}} up"),
        Target(f"sum by (cluster, node) ({S('raypulse_gpu_event_watcher_errors_total')})", "{{node}} errors"),
        Target(S("raypulse_gpu_pod_resources_up"), "{{node}} pod-resources")),
        "The XID event watcher thread: 1 while it waits for events; errors it hit. Pod-resources: 1 while the "
        "kubelet's pod-resources API answers (the GPUs' pod labels); 0: the labels are empty, the samples stay.",
        min=0),
    Panel("NVML", "short", (Target(S("raypulse_gpu_nvml_info"), instant=True),),
          "NVML, driver, CUDA and nvidia-ml-py versions of each node.", kind="table", width=16),
))

BOARD = Board(
    uid=UID_GPU, title="raypulse / GPU",
    description="One GPU or all: utilization and activity, memory, clocks and clock events, temperatures, "
                "power, XIDs, ECC, row remapping, NVLink, PCIe, MIG, and the Ray jobs using each GPU.",
    variables=("cluster", "node", "gpu"), tags=("gpu",),
    rows=(OVERVIEW, ERRORS, JOBS, ACTIVITY, MEMORY, CLOCKS, THERMAL, NVLINK, PCIE, MIG, COLLECTOR),
)
