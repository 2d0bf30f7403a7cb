"""The evidence a KubeRay restart keeps: before the restart path (follow.py's `stop` with restart) deletes the
RayJob, and with it every Ray pod, the stacks of the job's processes and the Ray pods' logs are saved with the
run, bounded in size and in time. Gathering never stands in the restart's way: it ends by EVIDENCE_S whatever
answers, and what it could not take is said once, in the one `health.evidence` event of the restart.

Stacks: the Ray dashboard of the head pod, reached through the API server's pod proxy (as the sidecars are:
`get pods/proxy`, no route to the pods' network), with the run's Ray token in `X-Ray-Authorization` (the
header Ray's dashboard takes from proxies, which keep `Authorization` for themselves; KubeRay's own dashboard
client sends it). The dashboard asks Ray's agent on each Ray pod for py-spy dumps of the job's driver, actors,
task workers and the entrypoint's subprocesses (launcher/health/stacks.py, as on local runs), saved under
`stacks/attempt-N/` (where `launcher diagnose` reads them). A dump needs py-spy to attach inside the Ray
container: the dashboard needs RAY_DASHBOARD_ENABLE_PROFILING=1 and the container ptrace (Kubernetes'
`SYS_PTRACE` where the node's Yama scope asks for it); what was refused is said.

Logs: every Ray pod's and the submitter's, as `launcher logs --all-nodes` gathers them (podlogs.py), within
LOG_BYTES for all together, under `evidence/attempt-N/pod-logs/`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.backends.kuberay import podlogs
from launcher.backends.kuberay.proxy import PodProxyReader, ProxiedStatus
from launcher.backends.kuberay.render import RAY_PORTS, run_token
from launcher.health import stacks
from launcher.raydash import READ_TIMEOUT_S, RayDashboard

if TYPE_CHECKING:
    from launcher.backends.kuberay.follow import RayJobAttempts

EVIDENCE_S = 60.0  # the restart waits at most this long for its evidence
LOG_BYTES = 16 * 2**20  # the Ray pods' logs of one restart, all together
DASHBOARD_PORT = dict(RAY_PORTS)["dashboard"]
RAY_PROXY_AUTH_HEADER = "X-Ray-Authorization"


class ProxiedDashboard(RayDashboard):
    """The head pod's Ray dashboard through the API server's pod proxy: the same bounds as every read of a pod
    (proxy.py); the dashboard's own statuses come back as a RayDashboard gives them, the API server's refusals
    as an OSError that says so."""

    def __init__(self, api_client: Any, namespace: str, pod: str, token: str) -> None:
        self._reader = PodProxyReader(api_client, namespace, pod, DASHBOARD_PORT,
                                      headers={RAY_PROXY_AUTH_HEADER: f"Bearer {token}"})
        super().__init__(self._reader.url, token)

    def get(self, path: str, timeout: float | None = None) -> tuple[int, bytes]:
        try:
            answer = self._reader(path, READ_TIMEOUT_S if timeout is None else timeout)
        except ProxiedStatus as exc:
            if exc.by_api_server:  # RBAC, a pod gone: not the dashboard's answer
                raise
            return exc.status, exc.body  # the dashboard's own (a 403: stack dumps are off), as stacks.py reads it
        return 200, answer.body or b""


def keep(jobs: RayJobAttempts, attempt: int, deadline_s: float = EVIDENCE_S) -> None:
    """Save the attempt's stacks and its Ray pods' logs with the run, by `deadline_s`; one `health.evidence`
    event says what was saved and what was not. Never raises."""
    deadline = time.monotonic() + deadline_s
    record = jobs.record
    directory = record.directory / "evidence" / f"attempt-{attempt}"
    view = jobs.views.get(attempt)
    said: dict[str, str] = {}
    try:
        pods = podlogs.ray_pods(jobs.core, jobs.namespace, jobs.name, jobs.cluster_name)
    except Exception as exc:  # noqa: BLE001 - no listing: nothing to gather, said below
        pods, said["pods"] = [], f"the Ray pods could not be listed ({podlogs.why(exc)})"
    parts = {"logs": lambda: _logs(jobs, pods, directory / "pod-logs", deadline)}
    if jobs.spec is None or jobs.spec.health.stacks:
        parts["stacks"] = lambda: _stacks(jobs, pods, view.submission_id if view else None,
                                          record.directory / "stacks" / f"attempt-{attempt}")
    threads = [threading.Thread(target=_into, args=(said, name, part), name=f"evidence-{name}", daemon=True)
               for name, part in parts.items() if "pods" not in said]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    late = [name for name in parts if name not in said and "pods" not in said]
    summary = "; ".join([said[name] for name in ("pods", "stacks", "logs") if name in said]
                        + [f"{name}: not done within {deadline_s:g}s (the restart goes on)" for name in late])
    jobs.journal.emit("health.evidence", attempt=attempt, summary=summary, directory=str(directory))


def _into(said: dict[str, str], name: str, part: Any) -> None:
    try:
        said[name] = part()
    except Exception as exc:  # noqa: BLE001 - evidence is a courtesy: whatever went wrong is said, once
        said[name] = f"{name}: not taken ({podlogs.why(exc)})"


def _logs(jobs: RayJobAttempts, pods: list[tuple[str, str, str]], directory: Path, deadline: float) -> str:
    if not pods:
        return "logs: no Ray pod to read"
    return "logs: " + podlogs.gather(jobs.core, jobs.namespace, pods, directory, LOG_BYTES, deadline).summary


def _stacks(jobs: RayJobAttempts, pods: list[tuple[str, str, str]], submission_id: str | None,
            directory: Path) -> str:
    head = next((name for name, _, role in pods if role == "head"), None)
    if head is None or not submission_id:
        return "stacks: no head pod" if head is None else "stacks: the attempt has no Ray job yet"
    dashboard = ProxiedDashboard(jobs.access.api_client, jobs.namespace, head, run_token(jobs.name))
    job = dashboard.get_json(f"/api/jobs/{submission_id}")
    processes = stacks.job_processes(dashboard, job.get("job_id"), job.get("driver_info"),
                                     submission_id=submission_id)
    return "stacks: " + stacks.collect(dashboard, processes, directory).summary
