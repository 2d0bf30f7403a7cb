"""`/sd` on the head exporter: Prometheus HTTP service discovery of every alive Ray node's exporter.

Each node's exporter port comes from its Ray node label `raypulse.io/exporter-port` (the launcher
sets it with `ray start --labels`); a node without it is assumed to use the head exporter's own
port (a cluster started by hand, every exporter on the same port), unless `launcher exporters
deploy` placed an exporter there: then the port its Ray actor is named with, `exporter-<node
id>-<port>` in the namespace DEPLOY_NAMESPACE (node labels cannot change once a node runs, so the
port travels in the actor name, which the State API lists over HTTP). One target group per node:

    [{"targets": ["10.0.0.5:9477"],
      "labels": {"cluster": "demo", "node": "10.0.0.5", "role": "worker", "ray_node_id": "ab12..."}}]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from exporter.collectors.ray.cluster import Node
from exporter.collectors.ray.localray import EXPORTER_PORT_LABEL

# The same names as launcher/deploy/raypulse_agent (tests/test_launcher_deploy.py holds them equal).
DEPLOY_NAMESPACE = "raypulse"
DEPLOYED_ACTOR_PREFIX = "exporter-"


def deployed_ports(actors: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Node id -> exporter port, from the alive actors of DEPLOY_NAMESPACE (State API rows)."""
    ports = {}
    for actor in actors:
        name = str(actor.get("name") or "")
        node_id, _, port = name.removeprefix(DEPLOYED_ACTOR_PREFIX).rpartition("-")
        if name.startswith(DEPLOYED_ACTOR_PREFIX) and node_id and port.isdigit() and 0 < int(port) < 65536:
            ports[node_id] = int(port)
    return ports


def target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def target_groups(nodes: Iterable[Node], cluster: str, fallback_port: int,
                  deployed: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    groups = []
    deployed = deployed or {}
    for node in sorted((n for n in nodes if n.alive and n.node_ip), key=lambda n: (not n.is_head, n.node_id)):
        port_label = node.labels.get(EXPORTER_PORT_LABEL, "")
        if port_label.isdigit() and 0 < int(port_label) < 65536:
            port = int(port_label)
        else:
            port = deployed.get(node.node_id, fallback_port)
        groups.append({"targets": [target(node.node_ip, port)],
                       "labels": {"cluster": cluster, "node": node.node_name or node.node_ip,
                                  "role": "head" if node.is_head else "worker", "ray_node_id": node.node_id}})
    return groups
