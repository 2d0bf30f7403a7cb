"""Small helpers the boards share: PromQL fragments, dashboard uids and the links between them."""

from __future__ import annotations

from dashboards.model import Link

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


def rate(selector: str, window: str = RATE) -> str:
    return f"rate({selector}[{window}])"


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
