"""The target groups the head exporter serves at wire.ROLLOUT_SD_PATH: every RL run's rollout servers (verl's
vLLM/SGLang HTTP servers, which serve their engine's own /metrics, `vllm:*` names), as the runs reported them
(exporter/progress/rollout.py), scraped as job wire.ROLLOUT_METRICS_JOB.

One group per server, labelled with its run's `job_id` and `submission_id` (the labels every job series has;
the one the report did not name is looked up in Ray's Jobs API), the engine (wire.ROLLOUT_LABEL), and as
/sd/ray labels Ray's metrics agents: `cluster`, and the `node`, `role`, `ray_node_id` of the exporter at the
same address when one alone is there:

    [{"targets": ["10.0.0.5:40123"],
      "labels": {"cluster": "demo", "node": "workers-1", "role": "worker", "ray_node_id": "ab12...",
                 "job_id": "02000000", "submission_id": "rl-run-1", "rollout": "vllm"}}]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from exporter.collectors.ray.metrics_agents import agent_groups
from exporter.contract import wire
from exporter.progress.rollout_targets import JobKey


def rollout_groups(rollouts: Mapping[JobKey, Mapping[str, str]], resolve: Callable[[str, str], JobKey],
                   exporter_groups: Iterable[Mapping[str, Any]], cluster: str) -> list[dict[str, Any]]:
    """`rollouts`: server -> engine by (job_id, submission_id) as reported; `resolve` fills in the other id.
    One agent_groups call for every job's servers: the exporters' addresses are indexed once, not per job."""
    if not rollouts:
        return []  # no RL run told of servers (most clusters): the exporters are not indexed at all
    servers = []  # (the job's ids, server, engine), in order
    for key, engines in rollouts.items():
        job = resolve(*key)
        servers += [(job, server, engine) for server, engine in engines.items()]
    groups = agent_groups([server for _, server, _ in servers], exporter_groups, cluster)
    for ((job_id, submission_id), _, engine), group in zip(servers, groups, strict=True):
        group["labels"].update({"job_id": job_id, "submission_id": submission_id, wire.ROLLOUT_LABEL: engine})
    return groups
