"""Taking a faulty node out of the next attempt.

- A local cluster replaces the worker: the node is stopped and a fresh one with the same group spec,
  labels and exporter is started (with healthy GPUs); the second time the same node faults, it is
  retired and the run goes on without it.
- An existing cluster drains the node through Ray (the GCS drain API behind `ray drain-node`,
  reason preemption, run by the deploy agent as a short Ray job: only the dashboard and the token
  are needed), so Ray schedules nothing new there; Ray's node ids change when a node restarts, so
  the host is also kept on the run's deny list and drained again before every attempt.
- KubeRay restarts a pod whose Ray container died and builds a new RayCluster per retry; the
  launcher does not follow KubeRay runs (docs/healing.md).
"""

from __future__ import annotations

import json
from typing import Any

from launcher.deploy import remote
from launcher.errors import InfraError
from launcher.health.faults import Fault
from launcher.jobs import JobsClient
from launcher.local import LocalCluster
from launcher.state import RunRecord


class LocalRemedy:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    def dead_nodes(self) -> list[str]:
        return self.cluster.dead_nodes()

    def take_out(self, node: str, fault: Fault, for_good: bool) -> tuple[str, dict[str, Any]]:
        if for_good:
            self.cluster.retire_node(node)
            return "node.retired", {"faults": "twice"}
        seconds = self.cluster.replace_node(node)
        return "node.replaced", {"seconds": round(seconds, 1)}

    def before_attempt(self, record: RunRecord) -> None:
        """A local cluster's replaced nodes are new processes: nothing is kept out by host."""


class DrainRemedy:
    def __init__(self, client: JobsClient) -> None:
        self.client = client

    def dead_nodes(self) -> list[str]:
        return []  # Ray's own view (the head exporter's node series) tells the watcher

    def take_out(self, node: str, fault: Fault, for_good: bool) -> tuple[str, dict[str, Any]]:
        node_ids = list(fault.evidence.get("ray_node_ids") or [])
        host = str(fault.evidence.get("host") or "")
        result = self._drain(node_ids, [host] if for_good and host else [], fault.summary)
        return "node.drained", {"node_ids": result.get("drained", []), "host_denied": host if for_good else None}

    def before_attempt(self, record: RunRecord) -> None:
        if record.denied_hosts:
            self._drain([], record.denied_hosts, "host denied by an earlier fault of this run")

    def _drain(self, node_ids: list[str], hosts: list[str], message: str) -> dict[str, Any]:
        run = remote.run_agent(self.client, ["drain", json.dumps({"node_ids": node_ids, "hosts": hosts,
                                                                  "message": message[:200]})])
        if run.result is None:
            raise InfraError(f"the drain job {run.submission_id} ended {run.status}; its log ends:\n{run.logs[-1000:]}")
        return run.result
