"""`/sd` on the head exporter: Prometheus HTTP service discovery of every alive Ray node's exporter.

Each node's exporter port comes from its Ray node label `raypulse.io/exporter-port` (the launcher
sets it with `ray start --labels`); a node without it is assumed to use the head exporter's own
port (a cluster started by hand, every exporter on the same port). One target group per node:

    [{"targets": ["10.0.0.5:9477"],
      "labels": {"cluster": "demo", "node": "10.0.0.5", "role": "worker", "ray_node_id": "ab12..."}}]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from exporter.collectors.ray.cluster import Node
from exporter.collectors.ray.localray import EXPORTER_PORT_LABEL


def target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def target_groups(nodes: Iterable[Node], cluster: str, fallback_port: int) -> list[dict[str, Any]]:
    groups = []
    for node in sorted((n for n in nodes if n.alive and n.node_ip), key=lambda n: (not n.is_head, n.node_id)):
        port_label = node.labels.get(EXPORTER_PORT_LABEL, "")
        port = int(port_label) if port_label.isdigit() and 0 < int(port_label) < 65536 else fallback_port
        groups.append({"targets": [target(node.node_ip, port)],
                       "labels": {"cluster": cluster, "node": node.node_name or node.node_ip,
                                  "role": "head" if node.is_head else "worker", "ray_node_id": node.node_id}})
    return groups
