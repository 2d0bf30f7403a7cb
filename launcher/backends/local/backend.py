"""The local backend: a Ray cluster on this machine, started for the run (or a kept one it left
running), torn down when the run ends unless kept. A faulty worker is replaced by a fresh one; the
second time the same node faults it is retired and the run goes on without it."""

from __future__ import annotations

import importlib
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.backends.base import Placement, new_record
from launcher.backends.exporters import ClusterExporters
from launcher.backends.kept import cluster_client, local_checkpoint_dir, reach_cluster
from launcher.backends.kinds import LocalKind
from launcher.backends.local.cluster import LocalCluster
from launcher.backends.rayjobs import OnRayJobs, RayJobs
from launcher.errors import BadInput, InfraError
from launcher.jobs import JobsClient
from launcher.run import finish_run
from launcher.state import ClusterRecord, RunRecord, load_cluster, load_run

if TYPE_CHECKING:
    from launcher.health.faults import Fault
    from launcher.journal import Journal
    from launcher.spec import JobSpec

UP_CLUSTER_NAME = "local"  # `launcher up` without --name


class LocalRemedy:
    """Replace a faulty worker; retire it the second time."""

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


class LocalPlacement(Placement):
    """A run on a local cluster: its exporters are the cluster's, and the cluster goes with the run
    unless it is kept."""

    def __init__(self, cluster: LocalCluster, client: JobsClient, spec: JobSpec) -> None:
        super().__init__(jobs=RayJobs(client, spec), dashboard=client.dashboard,
                         exporters=ClusterExporters(lambda: cluster.record), remedy=LocalRemedy(cluster),
                         local_processes=True)
        self._cluster = cluster

    @property
    def cluster(self) -> ClusterRecord | None:
        return self._cluster.record

    def on_running(self) -> None:
        self._cluster.start_exporters()

    def close(self, journal: Journal) -> None:
        record = self._cluster.record
        if record is None:
            return
        if self._cluster.kept:
            journal.emit("cluster.kept", cluster=record.name, address=record.address)
            return
        self._cluster.teardown()

    def abort(self) -> None:
        self._cluster.teardown()


class LocalBackend(LocalKind, OnRayJobs):

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        # The cluster of an earlier submit of this run, still up (kept, or its launcher died).
        self.left_running = load_cluster(spec.run_id) if spec.run_id else None

    @staticmethod
    def reach(record: RunRecord, token_path: Path | None = None) -> JobsClient | None:
        return reach_cluster(record)

    def describe(self) -> str:
        return f"{self.name}, {self.spec.worker_count} worker(s)"

    def no_wait_refusal(self) -> str | None:
        if self.spec.keep_cluster:
            return None
        return ("the local cluster this submit starts is torn down when the command returns, and the job with it; "
                "add --keep-cluster (stop it later with `launcher down RUN_ID`), or submit to a running cluster "
                "(--cluster NAME from `launcher up`, or --address URL)")

    def checkpoint_dir(self) -> str | None:
        return local_checkpoint_dir(self.spec)

    def run_record(self) -> RunRecord:
        """The record of a run whose cluster is still up; a run whose cluster is gone is not continued."""
        spec = self.spec
        found = load_run(spec.run_id) if spec.run_id else None
        if self.left_running is None and found is not None and found.exit_code is not None:
            raise BadInput(f"run_id: run {spec.run_id} already ended {found.state} (exit {found.exit_code}) and its "
                           f"cluster is gone; see `launcher status {spec.run_id}`, or choose another --run-id")
        if found is not None and self.left_running is not None:
            return found
        return new_record(spec, self.name)

    def place(self, journal: Journal, cancel: threading.Event, detach: bool) -> Placement:
        spec, left = self.spec, self.left_running
        if left is not None:
            # Follow the run on the cluster of its earlier submit, status first, instead of starting a second one.
            journal.reporter.info(f"cluster {left.name} of run {spec.run_id} is still running; following the run on it")
            cluster = LocalCluster.adopt(left, journal, cancel)
            client = cluster_client(left.name)[1]
            journal.emit("run.placed", address=left.address, cluster=left.name, kept=left.kept)
            return LocalPlacement(cluster, client, spec)
        # Ray's Jobs client takes a second to import: do it while the nodes start.
        threading.Thread(target=importlib.import_module, args=("ray.job_submission",), daemon=True).start()
        # A detached run's exporters start with the cluster: nothing is left to start them later.
        cluster = LocalCluster(spec, spec.run_id or spec.name, journal, cancel, kept=spec.keep_cluster,
                               defer_exporters=not detach)
        journal.emit("run.placed", cluster=spec.run_id, kept=spec.keep_cluster)
        try:
            started = cluster.start()
        except BadInput:
            assert journal.record is not None
            shutil.rmtree(journal.record.directory, ignore_errors=True)  # nothing was started: no run either
            raise
        except InfraError as exc:
            finish_run(journal, "INFRA_ERROR", str(exc))
            raise
        try:
            client = JobsClient(started.address, Path(started.token_path).read_text().strip())
        except BaseException:
            cluster.teardown()
            raise
        return LocalPlacement(cluster, client, spec)
