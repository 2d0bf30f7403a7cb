"""An RL run's rollout servers told to the head exporter, with no change to the framework's code: verl's
`LLMServerManager` (verl/workers/rollout/llm_server.py, verl 0.9.1) starts its vLLM or SGLang HTTP servers in
`_initialize_llm_servers` and keeps their addresses in `server_addresses`; those servers serve their engine's
own /metrics (vLLM's `vllm:*`). exporter/progress/hooks.py wraps that method in every Ray worker of a job
submitted with `--framework-metrics` (verl's TaskRunner actor among them) to call `report_servers` after it.

The head's exporter lists them at wire.ROLLOUT_SD_PATH, and its progress endpoint listens on the head's
loopback only, like every node's: so the report is a Ray task pinned to the head node (wire.HEAD_NODE_RESOURCE,
no CPU) that sends it there as the job's own report (`progress.rollout_servers`, with the token the launcher
gave the attempt). Its reference is dropped: nothing waits for it. Never raises into verl.
"""

from __future__ import annotations

from typing import Any

from exporter import progress
from exporter.contract import wire

FLUSH_SECONDS = 5.0  # the head task waits this long for its report to go out
_head_task: Any = None


def report_servers(rollout: Any, addresses: Any) -> None:
    """From any process of the job: tell the head's exporter where the rollout servers are (`addresses`:
    verl's host:port strings; `rollout`: its rollout name, vllm or sglang)."""
    try:
        servers = [str(address) for address in addresses or ()]
        if servers:
            _deliver(str(rollout), servers)
    except Exception:  # noqa: BLE001  (a metrics helper must never break training)
        return


def tell_head(rollout: str, servers: list[str]) -> None:
    """What runs on the head node: this node's exporter is the head's."""
    progress.rollout_servers(rollout, servers)
    progress.flush(FLUSH_SECONDS)


def _deliver(rollout: str, servers: list[str]) -> None:
    """Run tell_head on the head node, as a Ray task of this job (a process of the job has Ray initialized)."""
    global _head_task
    import ray

    if not ray.is_initialized():
        return
    if _head_task is None:
        _head_task = ray.remote(num_cpus=0, max_retries=3, resources={wire.HEAD_NODE_RESOURCE: 0.001})(tell_head)
    _head_task.remote(rollout, servers)
