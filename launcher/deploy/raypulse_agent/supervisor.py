"""The detached supervisor actor (pinned to the head node): every `interval_s` it places a
NodeExporter on each alive node that has none, forgets nodes that died, and asks every node's
actor to restart its exporter if it exited.

Ports: every node's exporter listens on `port` on its own IP (the progress endpoint on port + 1).
Nodes that share an IP (several raylets on one host) take the next free pair: port + 2k. The
port is part of the node actor's name, which is the registry /sd and `status` read.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from exporter.contract import wire

from .node import NodeExporter

log = logging.getLogger(__name__)
HEAD_RESOURCE = "node:__internal_head__"
REMOTE_CALL_SLACK_S = 60.0  # beyond the exporter's start timeout: worker start, runtime env setup


def is_head(node: dict[str, Any]) -> bool:
    return bool(node.get("IsHead")) or HEAD_RESOURCE in (node.get("Resources") or {})


def alive_nodes() -> dict[str, dict[str, Any]]:
    return {node["NodeID"]: node for node in ray.nodes() if node.get("Alive")}


def place_options(name: str, node_id: str) -> dict[str, Any]:
    """Detached, zero-resource, pinned to the node (soft=False: never elsewhere)."""
    return {"name": name, "namespace": wire.DEPLOY_NAMESPACE, "lifetime": "detached", "get_if_exists": True,
            "num_cpus": 0, "max_restarts": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}


@dataclass
class Placed:
    name: str
    host: str
    port: int
    actor: Any
    new: bool = True  # placed by the current reconcile


class Supervisor:
    def __init__(self, config: dict[str, Any], web_files: dict[str, str] | None = None) -> None:
        self.config = config  # compared by a second deploy; holds the web config's digest, never its files
        self.web_files = web_files  # `deploy --web-config`: the web config and its certificates, for every node
        self.lock = threading.Lock()
        self.placed: dict[str, Placed] = {}
        self.stopping = threading.Event()
        self.last_reports: list[dict[str, Any]] = []
        self._adopt()
        threading.Thread(target=self._loop, name="raypulse-supervisor", daemon=True).start()

    def settings(self) -> dict[str, Any]:
        return self.config

    def reconcile(self) -> list[dict[str, Any]]:
        with self.lock:
            if self.stopping.is_set():  # being removed: place nothing more
                return []
            self.last_reports = self._reconcile()
            return self.last_reports

    def shutdown(self) -> list[str]:
        """Stop the loop, every exporter and every node actor; the names of the actors removed."""
        self.stopping.set()
        with self.lock:
            removed = list(self.placed)
            for placed in self.placed.values():
                _stop_and_kill(placed.actor)
            self.placed.clear()
            return removed

    # -- internals -----------------------------------------------------------------------------

    def _adopt(self) -> None:
        """After a restart of this actor: take over the node actors that still run."""
        nodes = alive_nodes()
        for entry in ray.util.list_named_actors(all_namespaces=True):
            parsed = wire.parse_node_actor_name(entry["name"]) if entry["namespace"] == wire.DEPLOY_NAMESPACE else None
            if parsed is None:
                continue
            node_id, port = parsed
            try:
                actor = ray.get_actor(entry["name"], namespace=wire.DEPLOY_NAMESPACE)
            except ValueError:
                continue
            if node_id in nodes:
                self.placed[node_id] = Placed(entry["name"], nodes[node_id]["NodeManagerAddress"], port, actor, False)
            else:
                ray.kill(actor)

    def _loop(self) -> None:
        interval = float(self.config.get("interval_s", 5.0))
        while not self.stopping.wait(interval):
            try:
                self.reconcile()
            except Exception:  # the loop outlives any one failed round (GCS hiccup, ...)
                log.exception("raypulse supervisor: reconcile failed")

    def _reconcile(self) -> list[dict[str, Any]]:
        nodes = alive_nodes()
        for node_id in [n for n in self.placed if n not in nodes]:  # a dead node took its actor with it
            with _quiet():
                ray.kill(self.placed.pop(node_id).actor)
        for placed in self.placed.values():
            placed.new = False
        for node_id, node in sorted(nodes.items(), key=lambda item: not is_head(item[1])):
            if node_id not in self.placed:
                self.placed[node_id] = self._place(node_id, node)
        refs = {node_id: placed.actor.ensure.remote() for node_id, placed in self.placed.items()}
        timeout = float(self.config.get("start_timeout_s", 60)) + REMOTE_CALL_SLACK_S
        reports = []
        for node_id, ref in refs.items():
            placed = self.placed[node_id]
            try:
                report = ray.get(ref, timeout=timeout)
            except ray.exceptions.RayError as exc:  # the actor could not start (runtime env, worker) or hung
                report = {"node_id": node_id, "host": placed.host, "port": placed.port, "ok": False,
                          "error": f"the exporter actor failed: {type(exc).__name__}: {str(exc)[-1500:]}",
                          "stderr_tail": None, "pid": None}
                with _quiet():
                    ray.kill(placed.actor)
                del self.placed[node_id]  # placed afresh next round
            report.update(name=placed.name, placed_now=placed.new, role="head" if is_head(nodes[node_id]) else
                          "worker")
            reports.append(report)
        return reports

    def _place(self, node_id: str, node: dict[str, Any]) -> Placed:
        host = node["NodeManagerAddress"]
        base = int(self.config["port"])
        taken = {p.port for p in self.placed.values() if p.host == host}
        port = next(base + 2 * k for k in range(10_000) if base + 2 * k not in taken)
        name = wire.node_actor_name(node_id, port)
        role = "head" if is_head(node) else "worker"
        actor = ray.remote(NodeExporter).options(**place_options(name, node_id)).remote(
            node_id, host, port, role, self.config, self.web_files)
        return Placed(name, host, port, actor)


def _quiet() -> contextlib.suppress:
    """Best effort: an actor that is already gone is what we wanted."""
    return contextlib.suppress(ray.exceptions.RayError, ValueError)


def _stop_and_kill(actor: Any) -> None:
    with _quiet():
        ray.get(actor.stop.remote(), timeout=30)
    with _quiet():
        ray.kill(actor)
