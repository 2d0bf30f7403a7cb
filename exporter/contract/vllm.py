"""vLLM's engine metrics as Prometheus stores them when the engines run inside Ray (an RL run's
generators: verl's and OpenRLHF's rollouts), for the RL board's rollout-engine row.

vLLM's PrometheusStatLogger names them (vllm/v1/metrics/loggers.py, vLLM commit 005a810, the 0.10
line) with labels `model_name` and `engine`. Inside Ray, its RayPrometheusStatLogger
(vllm/v1/metrics/ray_wrappers.py) registers the same names through `ray.util.metrics` with ':' made
'_', and each node's Ray metrics agent serves them under Ray's `ray_` namespace
(ray/_private/metrics_agent.py, Ray 2.60): a counter gains `_total`, a histogram `_bucket`, `_sum` and
`_count`. Prometheus finds the agents at the head exporter's /sd/ray (job `ray`), whose target labels
give them `cluster` (and `node`, `role`, `ray_node_id` where the address names one node); they carry
no run label: the row is per cluster.

It sits in the exporter's contract room beside node_exporter.py: the dashboards read it and so does
a test job that reports as vLLM does; neither imports the other.
"""

from __future__ import annotations

import re

LABELS = frozenset({"model_name", "engine"})


def registered(vllm_name: str) -> str:
    """The name vLLM gives `ray.util.metrics` for `vllm:num_requests_running`: `vllm_num_requests_running`."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", vllm_name)


def through_ray(vllm_name: str, suffix: str = "") -> str:
    """...and the name Ray's metrics agent serves it under: `ray_vllm_num_requests_running` (+ `suffix`)."""
    return "ray_" + registered(vllm_name) + suffix


# vLLM's own names (vllm/v1/metrics/loggers.py), and their kind.
REQUESTS_RUNNING = "vllm:num_requests_running"  # gauge
REQUESTS_WAITING = "vllm:num_requests_waiting"  # gauge
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # gauge, 0-1
PREEMPTIONS = "vllm:num_preemptions"  # counter
GENERATION_TOKENS = "vllm:generation_tokens"  # counter
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"  # histogram

FAMILIES = {
    through_ray(REQUESTS_RUNNING): LABELS,
    through_ray(REQUESTS_WAITING): LABELS,
    through_ray(KV_CACHE_USAGE): LABELS,
    through_ray(PREEMPTIONS, "_total"): LABELS,
    through_ray(GENERATION_TOKENS, "_total"): LABELS,
    through_ray(TIME_TO_FIRST_TOKEN, "_bucket"): LABELS | {"le"},
}
