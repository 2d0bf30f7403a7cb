"""The driver `launcher exporters deploy|remove` submits as a Ray job (it runs on the head):

    python -m raypulse_agent deploy '<config JSON>'
    python -m raypulse_agent remove

It prints one wire.DEPLOY_RESULT_MARKER line with a JSON result and exits 1 when a node has no working
exporter (deploy) or something could not be removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from exporter import wire

from .supervisor import Supervisor, _stop_and_kill, alive_nodes, is_head


def _result(result: dict[str, Any], ok: bool) -> int:
    print(wire.DEPLOY_RESULT_MARKER + json.dumps(result), flush=True)
    return 0 if ok else 1


def deploy(config: dict[str, Any], dashboard_url: str) -> int:
    config = {**config, "dashboard_url": config.get("dashboard_url") or dashboard_url}
    head = next(node_id for node_id, node in alive_nodes().items() if is_head(node))
    existed = True
    try:
        supervisor = ray.get_actor(wire.DEPLOY_SUPERVISOR, namespace=wire.DEPLOY_NAMESPACE)
    except ValueError:
        existed = False
        supervisor = ray.remote(Supervisor).options(
            name=wire.DEPLOY_SUPERVISOR, namespace=wire.DEPLOY_NAMESPACE, lifetime="detached", get_if_exists=True,
            num_cpus=0,
            max_concurrency=4,  # status calls are answered while a reconcile runs
            max_restarts=-1,  # a restarted supervisor adopts the node actors that still run
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=head, soft=False)).remote(config)
    current = ray.get(supervisor.settings.remote())
    if current != config:
        differs = sorted(key for key in {*current, *config} if current.get(key) != config.get(key))
        return _result({"error": f"exporters are already deployed with other settings ({', '.join(differs)}: "
                                 f"{ {k: current.get(k) for k in differs} }); run `launcher exporters remove` "
                                 "first to deploy with new ones", "supervisor_existed": existed}, False)
    reports = ray.get(supervisor.reconcile.remote())
    return _result({"supervisor_existed": existed, "nodes": reports}, all(r["ok"] for r in reports))


def remove() -> int:
    removed: list[str] = []
    with contextlib.suppress(ValueError):
        supervisor = ray.get_actor(wire.DEPLOY_SUPERVISOR, namespace=wire.DEPLOY_NAMESPACE)
        removed = ray.get(supervisor.shutdown.remote(), timeout=300)
        ray.kill(supervisor)
        removed.append(wire.DEPLOY_SUPERVISOR)
    # Node actors the supervisor did not know (a supervisor that died mid-placement).
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] == wire.DEPLOY_NAMESPACE and wire.parse_node_actor_name(entry["name"]):
            with contextlib.suppress(ValueError):
                _stop_and_kill(ray.get_actor(entry["name"], namespace=wire.DEPLOY_NAMESPACE))
                removed.append(entry["name"])
    left = [e["name"] for e in ray.util.list_named_actors(all_namespaces=True)
            if e["namespace"] == wire.DEPLOY_NAMESPACE]
    return _result({"removed": removed, "left": left}, not left)


def main(argv: list[str]) -> int:
    context = ray.init(namespace=wire.DEPLOY_NAMESPACE, logging_level=logging.WARNING, log_to_driver=False)
    dashboard = context.dashboard_url or ""
    if argv[:1] == ["deploy"] and len(argv) == 2:
        return deploy(json.loads(argv[1]), dashboard if "://" in dashboard else f"http://{dashboard}")
    if argv == ["remove"]:
        return remove()
    print(f"usage: python -m raypulse_agent deploy CONFIG_JSON | remove (got {argv})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
