"""Cluster overview: the first screen. Jobs by state, Ray nodes, GPUs by health, alerts firing, the
fleet's GPUs in four numbers and GPU utilization by node on top; then resources, nodes, and the
exporters' own health.

The fleet-wide GPU panels read the recorded pre-aggregations (alerts/rules/scale.yaml): at 2,000
nodes a node's average is 2,000 series where every GPU's would be 16,000 a refresh. Panels that
need a GPU's own state (GPUs by health) read the GPU families."""

from __future__ import annotations

from dashboards.boards.common import (
    CLUSTER_GPUS,
    CLUSTER_MEMORY_TOTAL,
    CLUSTER_MEMORY_USED,
    CLUSTER_POWER,
    CLUSTER_UTILIZATION,
    CLUSTER_UTILIZATION_GPUS,
    NODE_UTILIZATION,
    NODE_UTILIZATION_GPUS,
    NOT_IDLE,
    UID_CLUSTER,
    UID_JOB,
    UID_NODE,
    rate,
    recorded,
    recorded_average,
    to_gpu,
    to_node,
)
from dashboards.model import Board, Link, Panel, Row, Target
from dashboards.selectors import Scope
from exporter.contract import node_exporter

S = Scope("cluster")
CRITICAL_XIDS = "48|61|62|63|64|74|79|92|94|95|119|120|140"  # as alerts/: reset or service needed
PER_NODE = "cluster, node"
PER_CLUSTER = "cluster"
# A GPU without a utilization reading (lost, or in MIG mode) is in the records' GPU count, not in their sum.
NO_READING_IS_IDLE = "A GPU without a utilization reading (lost, or in MIG mode) counts as idle."


def _table_link(uid: str, variable: str, column: str, title: str) -> Link:
    """A data link from a table row: tables have fields (`__data.fields`), not series labels."""
    return Link(title, f"/d/{uid}/{uid}?${{__url_time_range}}&${{datasource:queryparam}}"
                       f"&var-cluster=${{__data.fields.cluster}}&var-{variable}=${{__data.fields.{column}}}")


def _either(ours: str, theirs: str) -> str:
    """Per node, raypulse's node series or node_exporter's (exporter/contract/node_exporter.py)."""
    return node_exporter.either(ours, theirs, S("raypulse_exporter_build_info"))


def _exporters(expr: str) -> str:
    """`expr` over process_* (every client library's names, node_exporter's too) of raypulse's exporters only."""
    return f"{expr} and on (instance) {S('raypulse_exporter_build_info')}"


def _gpu_count(condition: str) -> str:
    """GPUs (one series per GPU) for which `condition` (a 0/1 `bool` comparison) holds, 0 when none."""
    return f"sum({condition})"


UP = S("raypulse_gpu_up")
XID_CRITICAL = S("raypulse_gpu_xid_last_timestamp_seconds", f'xid=~"{CRITICAL_XIDS}"')
THROTTLED = S("raypulse_gpu_clock_event_active", 'reason=~".*thermal.*|hw_power_brake_slowdown"')
CPU_GPU = 'resource=~"CPU|GPU"'
MEMORY = 'resource=~"memory|object_store_memory"'

SUMMARY = Row("Cluster", collapsed=False, panels=(
    Panel("Jobs by state", "short", (Target(f"sum by (state) ({S('raypulse_ray_jobs')})", "{{state}}"),),
          "Jobs the Ray head knows, by state.", kind="stat", width=6, height=5),
    Panel("Ray nodes by state", "short", (Target(f"sum by (state) ({S('raypulse_ray_nodes')})", "{{state}}"),),
          "Ray nodes alive and dead.", kind="stat", width=4, height=5),
    Panel("GPUs by health", "short", (
        Target(_gpu_count(f"{UP} == bool 1"), "healthy"),
        Target(_gpu_count(f"{UP} == bool 0"), "lost"),
        Target(f"count(count by (instance, uuid) (time() - {XID_CRITICAL} < 900))", "critical XID (15m)"),
        Target(_gpu_count(f"max by (instance, uuid) ({THROTTLED}) == bool 1"), "throttled"),
        Target(_gpu_count(f"{S('raypulse_gpu_ecc_errors_total', type='uncorrected')} > bool 0"),
               "uncorrected ECC"),
        Target(_gpu_count(f"{S('raypulse_gpu_row_remap_pending')} == bool 1"), "row remap pending")),
        "GPUs answering, lost, with a critical XID in the last 15 minutes, thermally or power-brake "
        "throttled, with uncorrected ECC errors, waiting for a reset to remap rows.", kind="stat", width=8,
        height=5),
    Panel("Alerts firing", "short", (
        Target(f"sum by (severity) ({S('ALERTS', alertstate='firing')})", "{{severity}}"),),
        "Firing alerts by severity (alerts/rules/).", kind="stat", width=6, height=5,
        thresholds=((None, "green"), (1, "red"))),
    Panel("GPUs", "short", (Target(recorded(S, CLUSTER_GPUS, PER_CLUSTER), "{{cluster}}"),),
          "GPUs the cluster's exporters report, answering or lost.", kind="stat", width=6, height=4),
    Panel("GPU utilization", "percentunit", (
        Target(recorded_average(S, CLUSTER_UTILIZATION, CLUSTER_UTILIZATION_GPUS, PER_CLUSTER), "{{cluster}}"),),
        "Average utilization over all of the cluster's GPUs. " + NO_READING_IS_IDLE, kind="stat", width=6,
        height=4, min=0, max=1),
    Panel("GPU memory in use", "percentunit", (
        Target(f"{recorded(S, CLUSTER_MEMORY_USED, PER_CLUSTER)} / {recorded(S, CLUSTER_MEMORY_TOTAL, PER_CLUSTER)}",
               "{{cluster}}"),),
        "Share of the GPU memory of all of the cluster's GPUs that is in use.", kind="stat", width=6, height=4,
        min=0, max=1),
    Panel("GPU power", "watt", (Target(recorded(S, CLUSTER_POWER, PER_CLUSTER), "{{cluster}}"),),
          "Power drawn by all of the cluster's GPUs together.", kind="stat", width=6, height=4, min=0),
    Panel("GPU utilization heat map", "percentunit", (
        Target(recorded_average(S, NODE_UTILIZATION, NODE_UTILIZATION_GPUS, PER_NODE), "{{node}}"),),
        "How busy the cluster's nodes are: each column is the spread of the nodes' average GPU utilization "
        "(one GPU's own: the GPU dashboard). " + NO_READING_IS_IDLE, kind="heatmap", width=12, height=9),
    Panel("GPU utilization by node", "percentunit", (
        Target(recorded_average(S, NODE_UTILIZATION, NODE_UTILIZATION_GPUS, PER_NODE), "{{node}}"),),
        "Average GPU utilization per node (click: the node's GPUs). " + NO_READING_IS_IDLE, width=12, height=9,
        min=0, max=1, links=(to_gpu("GPUs of ${__field.labels.node}", one_gpu=False),)),
    Panel("Jobs", "short", (
        Target(f"{S('raypulse_job_info')} * on (cluster, job_id, submission_id) group_left (state) "
               f"({S('raypulse_job_state')} == 1)", instant=True),),
        "Every job the head knows with its state (click: the job).", kind="table", width=24, height=7,
        links=(_table_link(UID_JOB, "submission", "submission_id", "Open job ${__data.fields.submission_id}"),)),
))

RESOURCES = Row("Resources and scheduling", collapsed=False, panels=(
    Panel("CPUs and GPUs", "short", tuple(
        Target(f"sum by (cluster, resource) ({S(f'raypulse_ray_resource_{kind}', CPU_GPU)})",
               "{{resource}} " + kind) for kind in ("capacity", "used", "demand")),
        "Logical CPUs and GPUs: the cluster's capacity, what is in use, and what pending work asks for.",
        min=0),
    Panel("Memory and object store", "bytes", tuple(
        Target(f"sum by (cluster, resource) ({S(f'raypulse_ray_resource_{kind}', MEMORY)})",
               "{{resource}} " + kind) for kind in ("capacity", "used")),
        "Ray's logical memory and object store memory: capacity and use (pending work rarely asks for "
        "memory, so its demand is on the CPUs and GPUs panel only).", min=0),
    Panel("GPUs in use by Ray node", "short", (
        Target(S("raypulse_ray_node_resource_used", resource="GPU"), "{{node_id}} used"),
        Target(S("raypulse_ray_node_resource_capacity", resource="GPU"), "{{node_id}} capacity")),
        "Logical GPUs per Ray node.", min=0),
    Panel("Actors by state", "short", (Target(f"sum by (state) ({S('raypulse_ray_actors')})", "{{state}}"),),
          "All actors of the cluster.", min=0, stack=True),
    Panel("Placement groups", "short", (
        Target(f"sum by (state) ({S('raypulse_ray_placement_groups')})", "{{state}}"),),
        "Placement groups by state.", min=0),
    Panel("Oldest pending placement group", "s", (
        Target(S("raypulse_ray_placement_group_oldest_pending_seconds"), "waiting"),),
        "How long the oldest pending placement group has waited for resources (0: none waits).", min=0),
))

NODES = Row("Nodes", collapsed=False, panels=(
    Panel("Ray nodes", "short", (
        Target(S("raypulse_ray_node_alive"), instant=True),
        Target(f"time() - {S('raypulse_ray_node_start_time_seconds')}", instant=True)),
        "Every Ray node: alive (1) or dead (0), and seconds since it started.", kind="table", width=12),
    Panel("Dead nodes", "short", (
        Target(S("raypulse_ray_node_death_reason"), instant=True),
        Target(f"time() - {S('raypulse_ray_node_end_time_seconds')}", instant=True)),
        "Nodes that died recently, why, and how long ago (seconds).", kind="table", width=12),
    Panel("Node deaths by reason", "short", (Target(S("raypulse_ray_node_deaths"), "{{reason}}"),),
          "Ray nodes dead in the retention window, by reason.", min=0),
    Panel("CPU busy by node", "percentunit", (
        Target(_either(f"sum by ({PER_NODE}) ({rate(S('raypulse_node_cpu_seconds_total', NOT_IDLE))}) "
                       f"/ sum by ({PER_NODE}) ({S('raypulse_node_cpus')})",
                       f"sum by ({PER_NODE}) ({rate(S('node_cpu_seconds_total', NOT_IDLE))}) "
                       f"/ count by ({PER_NODE}) ({S('node_cpu_seconds_total', mode='idle')})"), "{{node}}"),),
        "Share of each node's CPUs in use (click: the node).", min=0, max=1, links=(to_node(),)),
    Panel("Memory used by node", "percentunit", (
        Target(_either(f"1 - {S('raypulse_node_memory_available_bytes')} / {S('raypulse_node_memory_total_bytes')}",
                       f"1 - {S('node_memory_MemAvailable_bytes')} / {S('node_memory_MemTotal_bytes')}"), "{{node}}"),),
        "Share of each node's memory in use (click: the node).", min=0, max=1, links=(to_node(),)),
    Panel("Exporters with a raylet", "short", (Target(S("raypulse_ray_node_info"), instant=True),),
          "The node exporters that found a raylet (click: the node).", kind="table", width=24,
          links=(_table_link(UID_NODE, "node", "node", "Open node ${__data.fields.node}"),)),
))

EXPORTERS = Row("Exporters", (
    Panel("Scrape up", "bool", (Target(S("up"), "{{node}} {{job}} {{instance}}"),),
          "1 while Prometheus scrapes the node's exporter (and node_exporter, where /sd lists it).", min=0, max=1),
    Panel("Collectors down or stuck", "short", (
        Target(f"sum by ({PER_NODE}, collector) (1 - {S('raypulse_exporter_collector_up')})",
               "{{node}} {{collector}} down"),
        Target(f"sum by ({PER_NODE}, collector) ({S('raypulse_exporter_collector_stuck')})",
               "{{node}} {{collector}} stuck")),
        "Collectors whose last run failed, and collectors whose run is past its deadline.", min=0),
    Panel("Collector errors", "ops", (
        Target(f"sum by ({PER_NODE}, collector, kind) ({rate(S('raypulse_exporter_collector_errors_total'))})",
               "{{node}} {{collector}} {{kind}}"),
        Target(f"sum by ({PER_NODE}, resource) ({rate(S('raypulse_ray_state_truncations_total'))})",
               "{{node}} Ray cut a {{resource}} read")),
        "Collector errors per second by kind, and the head's State API reads Ray cut at 10,000 rows (the "
        "series built from them are left out; the head's log says which).", min=0),
    Panel("Collector run time vs interval", "s", (
        Target(S("raypulse_exporter_collector_duration_seconds"), "{{node}} {{collector}}"),
        Target(f"max by (collector) ({S('raypulse_exporter_collector_interval_seconds')})", "{{collector}} interval")),
        "How long each collector's last run took, against its interval.", min=0),
    Panel("Time since last success", "s", (
        Target(f"time() - {S('raypulse_exporter_collector_last_success_timestamp_seconds')}",
               "{{node}} {{collector}}"),),
        "Age of each collector's last good snapshot.", min=0),
    Panel("Collector runs and series", "short", (
        Target(f"sum by ({PER_NODE}, collector) ({rate(S('raypulse_exporter_collector_runs_total'))})",
               "{{node}} {{collector}} runs/s"),
        Target(S("raypulse_exporter_collector_series"), "{{node}} {{collector}} series")),
        "Runs per second and series served per collector.", min=0),
    Panel("Exporter CPU", "suffix: cores", (Target(_exporters(rate(S("process_cpu_seconds_total"))), "{{node}}"),),
          "CPU the exporter itself uses.", min=0),
    Panel("Exporter memory and handles", "bytes", (
        Target(_exporters(S("process_resident_memory_bytes")), "{{node}} resident"),
        Target(_exporters(S("process_virtual_memory_bytes")), "{{node}} virtual")),
        "Resident and virtual memory of the exporter process.", min=0),
    Panel("Exporter threads and files", "short", (
        Target(S("raypulse_exporter_threads"), "{{node}} threads"),
        Target(_exporters(S("process_open_fds")), "{{node}} open files"),
        Target(_exporters(S("process_max_fds")), "{{node}} file limit")),
        "Threads and open file descriptors of the exporter, against its file limit.", min=0),
    Panel("Exporter connections", "short", (
        Target(S("raypulse_exporter_http_connections"), "{{node}} open"),
        Target(S("raypulse_exporter_http_connection_limit"), "{{node}} limit")),
        "Connections open to each exporter's HTTP ports, against its cap (http.max_connections).", min=0),
    Panel("Exporter clients refused and dropped", "ops", (
        Target(f"sum by ({PER_NODE}, reason) ({rate(S('raypulse_exporter_http_refused_total'))})",
               "{{node}} 503 {{reason}}"),
        Target(f"sum by ({PER_NODE}, reason) ({rate(S('raypulse_exporter_http_closed_total'))})",
               "{{node}} closed {{reason}}"),
        Target(f"sum by ({PER_NODE}, kind) ({rate(S('raypulse_exporter_http_client_errors_total'))})",
               "{{node}} client {{kind}}")),
        "Per second: clients answered 503 (over a bound), connections the exporter closed (idle, slow, "
        "evicted), and client errors (malformed requests, disconnects).", min=0),
    Panel("Exporter uptime", "s", (
        Target(f"time() - {S('raypulse_exporter_start_time_seconds')}", "{{node}} serving"),
        Target(_exporters(f"time() - {S('process_start_time_seconds')}"), "{{node}} process")),
        "Time since each exporter started serving, and since its process started (a reset means a restart).",
        min=0),
    Panel("OTLP push", "ops", (
        Target(f"sum by ({PER_NODE}, result) ({rate(S('raypulse_exporter_otlp_exports_total'))})",
               "{{node}} {{result}}"),
        Target(f"sum by ({PER_NODE}) ({rate(S('raypulse_exporter_otlp_dropped_points_total'))})",
               "{{node}} points dropped")),
        "OTLP exports per second by result, and points dropped, where OTLP push is configured.", min=0),
    Panel("Last OTLP export", "s", (
        Target(f"time() - {S('raypulse_exporter_otlp_last_success_timestamp_seconds')}", "{{node}}"),),
        "Time since the OTLP endpoint last accepted an export.", min=0),
    Panel("Ray dashboard API", "s", (
        Target(S("raypulse_ray_dashboard_request_duration_seconds"), "{{node}} request time"),),
        "How long the Ray dashboard took to answer the exporter.", min=0),
    Panel("Ray dashboard errors", "ops", (
        Target(f"sum by ({PER_NODE}, kind) ({rate(S('raypulse_ray_dashboard_errors_total'))})", "{{node}} {{kind}}"),
        Target(f"1 - {S('raypulse_ray_up')}", "{{node}} dashboard unreachable")),
        "Failed requests to the Ray dashboard per second, and exporters that cannot reach it.", min=0),
    Panel("Versions", "short", (
        Target(S("raypulse_exporter_build_info"), instant=True),
        Target(S("raypulse_ray_info"), instant=True)),
        "Exporter, Python and prometheus_client versions; Ray version and session.", kind="table", width=24),
))

BOARD = Board(
    uid=UID_CLUSTER, title="raypulse / Cluster overview",
    description="The first screen: jobs by state, Ray nodes, GPUs by health, alerts firing, the fleet's GPUs "
                "(count, utilization, memory, power) and GPU utilization by node, resources, nodes and the "
                "exporters' own health.",
    variables=("cluster",), tags=("cluster",), rows=(SUMMARY, RESOURCES, NODES, EXPORTERS),
)
