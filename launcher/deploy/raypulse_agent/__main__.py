"""The driver `launcher exporters deploy|remove` submits as a Ray job (it runs on the head), and the
one the launcher's healing submits to keep a faulty node out of the next attempt:

    python -m raypulse_agent deploy '<config JSON>'
    python -m raypulse_agent remove
    python -m raypulse_agent drain '{"node_ids": [...], "hosts": [...], "message": "..."}'

It prints one wire.DEPLOY_RESULT_MARKER line with a JSON result and exits 1 when a node has no working
exporter (deploy) or something could not be removed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from exporter.contract import wire

from . import WEB_DIR
from .supervisor import Supervisor, _stop_and_kill, alive_nodes, is_head


def _result(result: dict[str, Any], ok: bool) -> int:
    print(wire.DEPLOY_RESULT_MARKER + json.dumps(result), flush=True)
    return 0 if ok else 1


def _web_files() -> dict[str, str] | None:
    """The bundle of `deploy --web-config`: the files of the py_module WEB_DIR that came with this job.
    Read before ray.init, while the job's own runtime env files are surely there."""
    spec = importlib.util.find_spec(WEB_DIR)
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations)))
    return {path.name: path.read_text() for path in sorted(directory.iterdir())
            if path.is_file() and path.name != "__init__.py"}


def deploy(config: dict[str, Any], dashboard_url: str, web_files: dict[str, str] | None = None) -> int:
    config = {**config, "dashboard_url": config.get("dashboard_url") or dashboard_url}
    if bool(web_files) != bool(config.get("web_config_sha256")):
        return _result({"error": f"the web config bundle (py_module {WEB_DIR}) did not reach the deploy job"}, False)
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
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=head, soft=False)).remote(config, web_files)
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


def drain(request: dict[str, Any]) -> int:
    """Drain the named nodes and every alive node on a denied host, through the GCS drain API behind
    `ray drain-node` (reason preemption: always accepted; Ray schedules nothing new there)."""
    from ray.core.generated import autoscaler_pb2

    gcs = ray._raylet.GcsClient(address=ray.get_runtime_context().gcs_address)
    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
    hosts = set(request.get("hosts") or [])
    wanted = set(request.get("node_ids") or [])
    wanted |= {node_id for node_id, node in alive_nodes().items() if node.get("NodeManagerAddress") in hosts
               and not is_head(node)}
    drained, refused = [], {}
    for node_id in sorted(wanted):
        accepted, rejection = gcs.drain_node(node_id, reason, str(request.get("message") or "raypulse"), 0)
        if accepted:
            drained.append(node_id)
        else:
            refused[node_id] = rejection
    return _result({"drained": drained, "refused": refused}, not refused)


def main(argv: list[str]) -> int:
    web_files = _web_files() if argv[:1] == ["deploy"] else None
    context = ray.init(namespace=wire.DEPLOY_NAMESPACE, logging_level=logging.WARNING, log_to_driver=False)
    dashboard = context.dashboard_url or ""
    if argv[:1] == ["deploy"] and len(argv) == 2:
        return deploy(json.loads(argv[1]), dashboard if "://" in dashboard else f"http://{dashboard}", web_files)
    if argv == ["remove"]:
        return remove()
    if argv[:1] == ["drain"] and len(argv) == 2:
        return drain(json.loads(argv[1]))
    print(f"usage: python -m raypulse_agent deploy CONFIG_JSON | remove | drain REQUEST_JSON (got {argv})",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
