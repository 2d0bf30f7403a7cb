"""Small helpers the boards share: PromQL fragments, dashboard uids, the links between them, and
how a panel reads the recorded pre-aggregations."""

from __future__ import annotations

from dashboards.model import Link
from dashboards.selectors import Scope

RATE = "$__rate_interval"

UID_CLUSTER = "raypulse-cluster"
UID_JOB = "raypulse-job"
UID_NODE = "raypulse-node"
UID_GPU = "raypulse-gpu"
UID_TRAINING = "raypulse-training"
UID_RL = "raypulse-rl"

# Matchers used inside f-strings (Python 3.11 allows no backslash in an f-string expression).
NOT_IDLE = 'mode!~"idle|iowait"'
NOT_IDLE_ONLY = 'mode!="idle"'
NOT_LOOPBACK = 'interface!="lo"'
TRAINING_ALERTS = 'scope=~"training|job"'

STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED")

# The pre-aggregations of alerts/rules/scale.yaml (named in alerts/groups/scale.py, which dashboards/
# may not import: Scope checks each name against the rule file, so a renamed record fails the build).
# They ship wherever the alert rules do; docs/dashboards.md says which panels read them.
CLUSTER_GPUS = "cluster:raypulse_gpus:count"
CLUSTER_UTILIZATION = "cluster:raypulse_gpu_utilization_ratio:sum"
CLUSTER_UTILIZATION_GPUS = "cluster:raypulse_gpu_utilization_ratio:count"  # lost and MIG GPUs left out
CLUSTER_MEMORY_USED = "cluster:raypulse_gpu_memory_used_bytes:sum"
CLUSTER_MEMORY_TOTAL = "cluster:raypulse_gpu_memory_total_bytes:sum"
CLUSTER_POWER = "cluster:raypulse_gpu_power_usage_watts:sum"
NODE_GPUS = "cluster_node:raypulse_gpus:count"
NODE_UTILIZATION = "cluster_node:raypulse_gpu_utilization_ratio:sum"
NODE_UTILIZATION_GPUS = "cluster_node:raypulse_gpu_utilization_ratio:count"
JOB_GPUS = "cluster_job:raypulse_job_gpus:count"
JOB_SM = "cluster_job:raypulse_job_gpu_sm_utilization_ratio:sum"
JOB_MEMORY = "cluster_job:raypulse_job_gpu_memory_used_bytes:sum"
JOB_UTILIZATION = "cluster_job:raypulse_gpu_utilization_ratio:sum"
JOB_POWER = "cluster_job:raypulse_gpu_power_usage_watts:sum"


def rate(selector: str, window: str = RATE) -> str:
    return f"rate({selector}[{window}])"


def recorded(scope: Scope, record: str, by: str) -> str:
    """A recorded sum or count, added up `by` the panel's labels. One Prometheus has one series per
    group already; a store holding several shards' records (each with its shard's external label)
    has one per shard, and this adds them up."""
    return f"sum by ({by}) ({scope(record)})"


def recorded_average(scope: Scope, total: str, count: str, by: str) -> str:
    """An average over GPUs from recorded sums and counts: `:sum / :count` at read time, never an
    average of the shards' averages."""
    return f"{recorded(scope, total, by)} / {recorded(scope, count, by)}"


def _url(uid: str, **variables: str) -> str:
    """A link into another dashboard that keeps the time range and the data source; `variables`
    map a dashboard variable to the series label whose value it takes."""
    params = "".join(f"&var-{name}=${{__field.labels.{label}}}" for name, label in variables.items())
    return f"/d/{uid}/{uid}?${{__url_time_range}}&${{datasource:queryparam}}{params}"


def to_job(title: str = "Open job ${__field.labels.submission_id}") -> Link:
    return Link(title, _url(UID_JOB, cluster="cluster", submission="submission_id"))


def to_training(title: str = "Training stability of ${__field.labels.submission_id}") -> Link:
    return Link(title, _url(UID_TRAINING, cluster="cluster", submission="submission_id"))


def to_node(title: str = "Open node ${__field.labels.node}") -> Link:
    return Link(title, _url(UID_NODE, cluster="cluster", node="node"))


def to_gpu(title: str = "Open GPU ${__field.labels.gpu} of ${__field.labels.node}", one_gpu: bool = True) -> Link:
    """To the GPU dashboard for the series' GPU, or for all GPUs of its node."""
    if one_gpu:
        return Link(title, _url(UID_GPU, cluster="cluster", node="node", gpu="gpu"))
    return Link(title, _url(UID_GPU, cluster="cluster", node="node"))
