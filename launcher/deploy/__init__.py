"""Observe an existing Ray cluster in one command: `launcher exporters deploy` puts a raypulse
exporter on every node, placed by Ray itself, and `launcher prometheus-config` points Prometheus
at them. See docs/deploy.md. On Kubernetes, `launcher exporters manifests` renders the exporter's
DaemonSet with the rules and dashboards beside it instead (manifests.py, docs/kubernetes.md).

Design, in short:
- Placement: one detached, zero-CPU actor per node (`raypulse_agent.node.NodeExporter`), pinned
  with NodeAffinitySchedulingStrategy(soft=False), runs `python -m exporter serve` on the node's
  IP as a subprocess that dies with it. A detached supervisor actor on the head places actors on
  nodes that join, forgets nodes that die and restarts exporters that exit, every `--interval`.
  All are named actors in the `raypulse` namespace, so a second deploy changes nothing.
- Code: the `exporter` and `raypulse_agent` packages travel in the Ray runtime env
  (`py_modules`), uploaded by the deploy job; hosts need nothing beyond Ray and the exporter's
  own dependencies (add missing ones with `--pip`).
- Access: deploy and remove run as a short Ray job through the Jobs API, status reads the State
  API over HTTP: the launcher needs only the dashboard URL and the Ray token, never the GCS.
- Discovery: every exporter listens on `--port` on its node's IP (nodes that share an IP take
  port + 2k). Ray node labels cannot change after a node starts, so the port is carried in the
  node actor's name, `exporter-<node id>-<port>`; the head exporter's /sd reads those names from
  the State API (no `import ray` in the exporter), after the launcher's own node labels.
"""

from launcher.deploy.cli import exporters_group, prometheus_config

__all__ = ["exporters_group", "prometheus_config"]
