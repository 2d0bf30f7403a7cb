"""The existing backend: a Ray cluster someone else runs, reached through its dashboard (--address, or
RAY_ADDRESS as for `ray job submit`), or a kept local cluster by name (--cluster). The launcher starts
nothing there; its exporters are the ones `launcher exporters deploy` placed (listed by the head
exporter's /sd) or, for a kept local cluster, the ones its record lists.

A faulty node is drained through Ray (the GCS drain API behind `ray drain-node`, reason preemption,
run by the deploy agent as a short Ray job: only the dashboard and the token are needed), so Ray
schedules nothing new there; Ray's node ids change when a node restarts, so the host is also kept on
the run's deny list and drained again before every attempt.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.backends.base import Exporters, Placement, new_record
from launcher.backends.exporters import ClusterExporters, DeployedExporters
from launcher.backends.kept import cluster_client, local_checkpoint_dir, reach_cluster
from launcher.backends.kinds import ExistingKind
from launcher.backends.rayjobs import OnRayJobs, RayJobs
from launcher.deploy import remote
from launcher.errors import BadInput, InfraError
from launcher.jobs import JobsClient, read_token
from launcher.state import RunRecord, load_cluster, load_run

if TYPE_CHECKING:
    from launcher.health.faults import Fault
    from launcher.journal import Journal
    from launcher.spec import JobSpec


def client_for(address: str | None, cluster: str | None, token_path: Path | None = None,
               headers: dict[str, str] | None = None, verify: bool | str | None = None) -> JobsClient:
    """A Jobs API client for a dashboard URL (with its token, and the spec's --headers/--verify) or a
    kept local cluster by name."""
    if cluster:
        return cluster_client(cluster)[1]
    if not address:
        raise BadInput("address: give --address URL (a Ray dashboard) or --cluster NAME (a kept local cluster)")
    return JobsClient(address, read_token(token_path), headers=headers, verify=verify)


class DrainRemedy:
    """Drain a faulty node through Ray; deny its host for good the second time."""

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


class ExistingBackend(ExistingKind, OnRayJobs):

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.kept = load_cluster(spec.cluster) if spec.cluster else None  # a kept local cluster: its record

    @staticmethod
    def reach(record: RunRecord, token_path: Path | None = None) -> JobsClient | None:
        """The run's kept local cluster, else its dashboard with --token-path, the file the run was
        submitted with, or where Ray looks."""
        try:
            client = reach_cluster(record)
            if client is not None or not record.address:
                return client
            submitted_with = record.spec.get("token_path")
            # --verify is recorded; --headers are not (they may hold credentials).
            return JobsClient(record.address, read_token(token_path or (Path(submitted_with) if submitted_with
                                                                       else None)), verify=record.spec.get("verify"))
        except BadInput:
            return None

    def describe(self) -> str:
        return self.name

    def no_wait_refusal(self) -> str | None:
        return None  # the cluster outlives the command

    def checkpoint_dir(self) -> str | None:
        """A kept local cluster's nodes are on this machine: made here. Elsewhere what the spec says (an
        absolute path or a URI, checked with the spec), since only the nodes can tell whether they reach it."""
        return local_checkpoint_dir(self.spec) if self.kept is not None else self.spec.checkpoint_dir

    def run_record(self) -> RunRecord:
        spec = self.spec
        return (load_run(spec.run_id) if spec.run_id else None) or new_record(spec, self.name)

    def place(self, journal: Journal, cancel: threading.Event, detach: bool) -> Placement:
        spec, kept = self.spec, self.kept
        client = client_for(spec.address, spec.cluster, spec.token_path, spec.headers, spec.verify)
        journal.emit("run.placed", address=client.address, cluster=spec.cluster)
        exporters: Exporters = ClusterExporters(lambda: kept) if kept is not None else DeployedExporters(client)
        return Placement(jobs=RayJobs(client, spec), dashboard=client.dashboard, exporters=exporters,
                         remedy=DrainRemedy(client), local_processes=kept is not None)
