"""The target groups the head exporter serves at /sd: Prometheus HTTP service discovery of every
alive Ray node's exporter.

Each node's exporter port comes from its Ray node label wire.NODE_LABEL_EXPORTER_PORT (the
launcher sets it with `ray start --labels`); a node without it is assumed to use the head
exporter's own port (a cluster started by hand, every exporter on the same port), unless
`launcher exporters deploy` placed an exporter there: then the port its Ray actor is named with
(wire.node_actor_name; node labels cannot change once a node runs, so the port travels in the
actor name, which the State API lists over HTTP). One target group per node:

    [{"targets": ["10.0.0.5:9477"],
      "labels": {"cluster": "demo", "node": "10.0.0.5", "role": "worker", "ray_node_id": "ab12..."}}]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from exporter import wire
from exporter.collectors.ray.cluster import Node


def deployed_ports(actors: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Node id -> exporter port, from the alive actors of wire.DEPLOY_NAMESPACE (State API rows)."""
    ports = {}
    for actor in actors:
        parsed = wire.parse_node_actor_name(str(actor.get("name") or ""))
        if parsed is not None:
            ports[parsed[0]] = parsed[1]
    return ports


def target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def target_groups(nodes: Iterable[Node], cluster: str, fallback_port: int,
                  deployed: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    groups = []
    deployed = deployed or {}
    for node in sorted((n for n in nodes if n.alive and n.node_ip), key=lambda n: (not n.is_head, n.node_id)):
        port_label = node.labels.get(wire.NODE_LABEL_EXPORTER_PORT, "")
        if port_label.isdigit() and 0 < int(port_label) < 65536:
            port = int(port_label)
        else:
            port = deployed.get(node.node_id, fallback_port)
        groups.append({"targets": [target(node.node_ip, port)],
                       "labels": {"cluster": cluster, "node": node.node_name or node.node_ip,
                                  "role": "head" if node.is_head else "worker", "ray_node_id": node.node_id}})
    return groups
