"""The cluster-side half of `launcher exporters`: Ray actors that keep one raypulse exporter on
every node, and the short driver (`python -m raypulse_agent`) that places or removes them.

This package is uploaded to the cluster as a Ray `py_modules` entry (top-level name
`raypulse_agent`, next to the `exporter` package), so it imports only the standard library and
`ray`: a node needs nothing beyond Ray to run it.

The registry of what runs where is the set of named actors in the NAMESPACE namespace: the
supervisor is SUPERVISOR, the actor of a node is `exporter-<node id>-<port>`. Ray's State API
lists them over HTTP, which is how the head exporter's /sd and `launcher exporters status` learn
each node's exporter port without importing ray (see exporter/collectors/ray/sd.py, which holds
the same two names).
"""

from __future__ import annotations

NAMESPACE = "raypulse"
SUPERVISOR = "supervisor"
NODE_ACTOR_PREFIX = "exporter-"
RESULT_MARKER = "RAYPULSE_AGENT_RESULT "  # the driver's last log line: this marker, then JSON


def node_actor_name(node_id: str, port: int) -> str:
    return f"{NODE_ACTOR_PREFIX}{node_id}-{port}"


def parse_node_actor_name(name: str) -> tuple[str, int] | None:
    """(node id, exporter port) of a node actor's name, or None for any other name."""
    if not name.startswith(NODE_ACTOR_PREFIX):
        return None
    node_id, _, port = name.removeprefix(NODE_ACTOR_PREFIX).rpartition("-")
    return (node_id, int(port)) if node_id and port.isdigit() else None
