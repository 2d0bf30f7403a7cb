"""Pre-aggregations for large clusters (issue 26): per job and per cluster, so that a fleet view
reads a few thousand series instead of every GPU's (2,000 nodes x 8 GPUs = 16,000 per family).

Every aggregate is a `sum` or a `count`, never an `avg`: with Prometheus sharded by target
(`launcher prometheus-config --shards N`), each shard sees only its nodes' GPUs, and sums and counts
of shards add up in the long-term store (`sum by (cluster, ...)` over the shards' records) where
averages would not. The average is then `:sum / :count`, one division at read time.

A job's GPUs are the GPUs its processes hold (raypulse_job_gpu_* from every node's exporter); a GPU
shared by two jobs counts for both.
"""

from __future__ import annotations

from alerts.config import Config
from alerts.model import RAY_JOB, Group, Record

# The GPUs of each job, one series per (GPU, job) with value 1, to join GPU-wide families on.
JOB_GPUS = f"count by (cluster, node, uuid, {RAY_JOB.split(', ', 1)[1]}) (raypulse_job_gpu_processes)"
ON_GPU = "on (cluster, node, uuid) group_right ()"

# level:metric:operation names; dashboards and docs/scale.md refer to them by these constants.
JOB_GPUS_COUNT = "cluster_job:raypulse_job_gpus:count"
JOB_SM_SUM = "cluster_job:raypulse_job_gpu_sm_utilization_ratio:sum"
JOB_MEMORY_SUM = "cluster_job:raypulse_job_gpu_memory_used_bytes:sum"
JOB_POWER_SUM = "cluster_job:raypulse_gpu_power_usage_watts:sum"
JOB_UTILIZATION_SUM = "cluster_job:raypulse_gpu_utilization_ratio:sum"
CLUSTER_GPUS_COUNT = "cluster:raypulse_gpus:count"
CLUSTER_UTILIZATION_SUM = "cluster:raypulse_gpu_utilization_ratio:sum"
# GPUs that report a utilization: a lost GPU or one in MIG mode has none, and must not count as idle.
CLUSTER_UTILIZATION_COUNT = "cluster:raypulse_gpu_utilization_ratio:count"
CLUSTER_MEMORY_SUM = "cluster:raypulse_gpu_memory_used_bytes:sum"
CLUSTER_MEMORY_TOTAL_SUM = "cluster:raypulse_gpu_memory_total_bytes:sum"
CLUSTER_POWER_SUM = "cluster:raypulse_gpu_power_usage_watts:sum"
NODE_GPUS_COUNT = "cluster_node:raypulse_gpus:count"
NODE_UTILIZATION_SUM = "cluster_node:raypulse_gpu_utilization_ratio:sum"
NODE_UTILIZATION_COUNT = "cluster_node:raypulse_gpu_utilization_ratio:count"


def group(_: Config) -> Group:
    return Group("scale", "Pre-aggregations per job and per cluster for large clusters (sums and counts)", [
        # Per job, from the nodes' process attribution.
        Record(JOB_GPUS_COUNT, f"count by ({RAY_JOB}) (raypulse_job_gpu_sm_utilization_ratio)"),
        Record(JOB_SM_SUM, f"sum by ({RAY_JOB}) (raypulse_job_gpu_sm_utilization_ratio)"),
        Record(JOB_MEMORY_SUM, f"sum by ({RAY_JOB}) (raypulse_job_gpu_memory_used_bytes)"),
        # Per job, GPU-wide families joined on the GPUs the job holds.
        Record(JOB_UTILIZATION_SUM,
               f"sum by ({RAY_JOB}) (raypulse_gpu_utilization_ratio * {ON_GPU} (0 * {JOB_GPUS} + 1))"),
        Record(JOB_POWER_SUM,
               f"sum by ({RAY_JOB}) (raypulse_gpu_power_usage_watts * {ON_GPU} (0 * {JOB_GPUS} + 1))"),
        # Per cluster (and per node for the fleet's node heatmap).
        Record(CLUSTER_GPUS_COUNT, "count by (cluster) (raypulse_gpu_up)"),
        Record(CLUSTER_UTILIZATION_SUM, "sum by (cluster) (raypulse_gpu_utilization_ratio)"),
        Record(CLUSTER_UTILIZATION_COUNT, "count by (cluster) (raypulse_gpu_utilization_ratio)"),
        Record(CLUSTER_MEMORY_SUM, "sum by (cluster) (raypulse_gpu_memory_used_bytes)"),
        Record(CLUSTER_MEMORY_TOTAL_SUM, "sum by (cluster) (raypulse_gpu_memory_total_bytes)"),
        Record(CLUSTER_POWER_SUM, "sum by (cluster) (raypulse_gpu_power_usage_watts)"),
        Record(NODE_GPUS_COUNT, "count by (cluster, node) (raypulse_gpu_up)"),
        Record(NODE_UTILIZATION_SUM, "sum by (cluster, node) (raypulse_gpu_utilization_ratio)"),
        Record(NODE_UTILIZATION_COUNT, "count by (cluster, node) (raypulse_gpu_utilization_ratio)"),
    ])
