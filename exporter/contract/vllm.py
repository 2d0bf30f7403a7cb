"""vLLM's engine metrics as Prometheus stores them in an RL run (the generators: verl's and OpenRLHF's
rollouts), for the RL board's rollout-engine row, in the two forms they reach Prometheus.

vLLM's PrometheusStatLogger names them (vllm/v1/metrics/loggers.py of vLLM 0.24.0, the version verl 0.9.1
pins; the six below are named alike since commit 005a810, the 0.10 line) with labels `model_name` and
`engine` (the engine's index).

- Its own HTTP server's /metrics (vllm/entrypoints/serve/instrumentator/metrics.py: prometheus_client's
  registry), as verl's rollout servers serve it: the names as they are, a counter with `_total`, a
  histogram with `_bucket`, `_sum` and `_count` (`vllm:num_preemptions_total`). Prometheus finds the servers
  at the head exporter's /sd/rollout (job `rollout`), whose target labels give them `cluster`, the run's
  `job_id` and `submission_id` and the engine's `rollout` (vllm), and `node`, `role`, `ray_node_id` where the
  address names one node. (vLLM serves the engine series only with its stats on: verl's
  `actor_rollout_ref.rollout.disable_log_stats=False`.)
- Inside Ray, with its RayPrometheusStatLogger (vllm/v1/metrics/ray_wrappers.py): the same names through
  `ray.util.metrics` with ':' made '_', served by each node's Ray metrics agent under Ray's `ray_` namespace
  (ray/_private/metrics_agent.py, Ray 2.60), with the same suffixes. Prometheus finds the agents at the head
  exporter's /sd/ray (job `ray`): `cluster` (and `node`, `role`, `ray_node_id`), no run label.

It sits in the exporter's contract room beside node_exporter.py: the dashboards read it and so do the tests
that report as vLLM does; neither imports the other.
"""

from __future__ import annotations

import re

from exporter.contract import wire

LABELS = frozenset({"model_name", "engine"})
# What /sd/rollout adds to the servers' own series (exporter/collectors/ray/rollout_sd.py)
ROLLOUT_TARGET_LABELS = frozenset({"job_id", "submission_id", wire.ROLLOUT_LABEL})


def registered(vllm_name: str) -> str:
    """The name vLLM gives `ray.util.metrics` for `vllm:num_requests_running`: `vllm_num_requests_running`."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", vllm_name)


def through_ray(vllm_name: str, suffix: str = "") -> str:
    """...and the name Ray's metrics agent serves it under: `ray_vllm_num_requests_running` (+ `suffix`)."""
    return "ray_" + registered(vllm_name) + suffix


def native(vllm_name: str, suffix: str = "") -> str:
    """The name vLLM's own /metrics serves it under: `vllm:num_preemptions` + `_total`."""
    return vllm_name + suffix


# vLLM's own names (vllm/v1/metrics/loggers.py), and their kind.
REQUESTS_RUNNING = "vllm:num_requests_running"  # gauge
REQUESTS_WAITING = "vllm:num_requests_waiting"  # gauge
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # gauge, 0-1
PREEMPTIONS = "vllm:num_preemptions"  # counter
GENERATION_TOKENS = "vllm:generation_tokens"  # counter
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"  # histogram

SERVED = ((REQUESTS_RUNNING, ""), (REQUESTS_WAITING, ""), (KV_CACHE_USAGE, ""), (PREEMPTIONS, "_total"),
          (GENERATION_TOKENS, "_total"), (TIME_TO_FIRST_TOKEN, "_bucket"))  # each name and the suffix it is read by
FAMILIES = {
    **{through_ray(name, suffix): LABELS | ({"le"} if suffix == "_bucket" else set()) for name, suffix in SERVED},
    **{native(name, suffix): LABELS | ROLLOUT_TARGET_LABELS | ({"le"} if suffix == "_bucket" else set())
       for name, suffix in SERVED},
}
