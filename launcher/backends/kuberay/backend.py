"""The KubeRay backend: the run is rendered as a RayJob (render.py) and applied to the cluster of the
kubeconfig context (access.py). KubeRay supervises it (backoffLimit retries, activeDeadlineSeconds, a new
RayCluster per retry), so the launcher hands it off: it records the run at once and the attempt engine
(launcher/run.py) follows the RayJob's attempts to KubeRay's end of it (follow.py says how).

The registry lists this class for every command: the renderer, the follower and Kubernetes access load in
the methods that use them, so that a command without a KubeRay run does not pay for them at start."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.backends.base import NodeLogs, new_record, unsupervised
from launcher.backends.kinds import KubeRayKind
from launcher.errors import BadInput, InfraError
from launcher.exitcodes import ExitCode
from launcher.jobs import JobsClient
from launcher.journal import Journal
from launcher.run import Run
from launcher.state import RunRecord, claim_supervision, load_run, release_supervision, request_stop
from launcher.tracing import RunTrace, traces_url

if TYPE_CHECKING:
    from launcher.backends.kuberay.access import KubeAccess
    from launcher.display import Reporter
    from launcher.healing import Healing
    from launcher.recording import Recorder
    from launcher.spec import JobSpec


def _watched(spec: JobSpec, journal: Journal, access: KubeAccess, namespace: str,
             cluster: Callable[[], str | None]) -> tuple[Healing | None, Recorder | None]:
    """The run's health watcher and recording on KubeRay, both reading the sidecars of the current
    RayCluster's pods through the API server (launcher/backends/kuberay/heal.py); a faulty GPU's node
    cordoned with health.cordon_nodes. Neither without sidecars (nothing to read); no watcher with health
    off; no recording with `record: off`, nor with the user's Prometheus (`prometheus:`: reports read it there) unless
    `record: on` was asked for (JobSpec.recorded)."""
    if not spec.sidecar:
        return None, None
    from kubernetes import client

    from launcher import recording
    from launcher.backends.kuberay.heal import NodeCordon, ray_pod_targets, scrape_targets
    from launcher.healing import Healing

    core = client.CoreV1Api(access.api_client)
    targets = ray_pod_targets(core, namespace, cluster, spec.exporter_port, https=bool(spec.exporter_web_config_secret))
    healing = None
    if spec.health.enabled:
        remedy = NodeCordon(core, spec.run_id or "") if spec.health.cordon_nodes else None
        healing = Healing(spec.health, journal, targets, remedy, blind_hint=(
            "no running Ray pod of the RayJob's cluster on a node, or no `list pods` for the launcher's account"),
            no_remedy="health.cordon_nodes is off: the node is not cordoned")
    recorder = None
    if spec.recorded:
        record = journal.record
        assert record is not None
        recorder = recording.start(record.directory, scrape_targets(targets, namespace, cluster),
                                   interval=spec.record_interval, meta={"run_id": record.run_id},
                                   notify=lambda kind, details: journal.emit(kind, **details),
                                   record_nodes=frozenset(spec.record_nodes), prometheus=spec.prometheus)
    return healing, recorder


class KubeRayBackend(KubeRayKind):

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec

    @staticmethod
    def reach(record: RunRecord, token_path: Path | None = None) -> JobsClient | None:
        return None  # its Ray clusters are KubeRay's: their dashboards are not reached from here

    def describe(self) -> str:
        return self.name

    def no_wait_refusal(self) -> str | None:
        return None

    def hand_off(self, reporter: Reporter, cancel: threading.Event, detach: bool) -> RunRecord:
        from launcher.backends.kuberay import render
        from launcher.backends.kuberay.access import kube_api
        from launcher.backends.kuberay.follow import RayJobAttempts

        access = kube_api(self.spec.context)
        assert self.spec.run_id is not None
        # One launcher follows a run: a second submit of the same run id is refused before it applies.
        claim_supervision(load_run(self.spec.run_id) or RunRecord(run_id=self.spec.run_id, name=self.spec.name,
                                                                   backend=self.name))
        applied = render.apply(self.spec, access)
        name, namespace = applied.rayjob["metadata"]["name"], applied.namespace
        spec = self.spec.model_copy(update={"namespace": namespace})  # recorded where it was applied
        record = (load_run(name) if applied.existed else None) or new_record(spec, self.name)
        record.pid, record.detached = os.getpid(), False
        run_trace = RunTrace(traces_url(spec.otlp_endpoint, os.environ), {
            "raypulse.run_id": spec.run_id, "raypulse.job_name": spec.name, "raypulse.backend": self.name},
            warn=reporter.warn)
        record.trace_id = run_trace.trace_id
        journal = Journal(reporter, record, run_trace)
        journal.emit("run.placed", address=access.server, namespace=namespace)  # recorded at once
        reporter.info(f"run {spec.run_id}: RayJob {name} in namespace {namespace} ({access.where()})"
                      + ("; following the one applied before" if applied.existed else "")
                      + (f"; {applied.pod_monitor}" if applied.pod_monitor != "ok" else ""))
        if detach:
            journal.emit("run.detached", attempt=None, submission_id=name)
            release_supervision(name)  # `status` and `stop` read and stop it from here on
            return record
        recorder = None
        jobs = RayJobAttempts(applied, access, journal, spec)
        try:
            healing, recorder = _watched(spec, journal, access, namespace, lambda: jobs.cluster_name)
            run = Run(spec, jobs, journal, cancel, healing=healing, recorder=recorder)
            jobs.watch()
            run.start()
            try:
                return run.wait()
            except InfraError as exc:  # the API server lost for good
                return run.finish_with(ExitCode.INFRA_ERROR, str(exc))
        finally:
            jobs.close()
            if recorder is not None:
                recorder.stop()
            journal.close(record.state)
            run_trace.finish(record.state, record.reason, {"raypulse.exit_code": record.exit_code,
                                                           "raypulse.attempts": len(record.attempts)})

    def checkpoint_dir(self) -> str | None:
        return self.spec.checkpoint_dir

    @classmethod
    def refresh(cls, record: RunRecord, token_path: Path | None = None) -> None:
        from launcher.backends.kuberay.follow import catch_up

        if record.detached or unsupervised(record):
            with contextlib.suppress(BadInput):  # a cluster that does not answer: the run as recorded
                catch_up(record)  # nobody else keeps its record up to date

    @classmethod
    def live_log(cls, record: RunRecord, attempt: int, write: Callable[[str], None], follow: bool,
                 token_path: Path | None = None) -> bool:
        """The latest attempt's submitter pod's log, while the pod is there and no log was saved."""
        from launcher.backends.kuberay.follow import pod_log

        latest = record.attempts[-1] if record.attempts else None
        if latest is None or latest.attempt != attempt or record.attempt_log(attempt).exists():
            return False
        return pod_log(record, write, follow)

    @classmethod
    def node_logs(cls, record: RunRecord, token_path: Path | None = None) -> NodeLogs | None:
        """The Ray pods' logs (head, workers, the submitter) as `kubectl ray log` gathers them."""
        from launcher.backends.kuberay.podlogs import run_pod_logs

        return run_pod_logs(record)

    @classmethod
    def stop_recorded(cls, record: RunRecord, token_path: Path | None = None) -> list[str]:
        if record.exit_code is not None:
            return []
        if not unsupervised(record):
            request_stop(record.run_id)  # its launcher deletes (or suspends) the RayJob and records the end
            Journal(run_id=record.run_id).emit("run.stop_requested", stopped=[record.run_id],
                                               trace_id=record.trace_id)
            return [record.run_id]
        from launcher.backends.kuberay.follow import stop_unfollowed

        return stop_unfollowed(record)
