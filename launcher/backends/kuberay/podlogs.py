"""Every Ray pod's log of a KubeRay run, gathered as `kubectl ray log rayjob/NAME` does it (kuberay's
kubectl-plugin, pkg/cmd/log/log.go): the RayJob's `status.rayClusterName`, its pods by KubeRay's
`ray.io/cluster=<name>` label (head first: `ray.io/node-type`), and of each the log of its first container
(the Ray container; KubeRay puts it first) through the API's log subresource
(`GET /api/v1/namespaces/NS/pods/NAME/log?container=C`), saved as `<pod>/stdout.log` under one directory.
The submitter pod (`batch.kubernetes.io/job-name=<RayJob>`, K8sJobMode) is gathered too: it holds the
driver's output. Not gathered: the files under /tmp/ray/session_latest/logs, which kubectl-ray copies with
`pods/exec` and tar; the launcher asks only `get pods/log`.

Bounded: one byte budget for all pods together (never per pod times the pods), shared out in order, each
pod keeping the end of its log (`tailLines` bounds what the server sends; the last bytes that fit are kept);
one deadline for the whole gathering. What was cut or could not be read is said, never dropped in silence.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from launcher.backends.base import NodeLogs
from launcher.backends.kuberay.access import api_error
from launcher.backends.kuberay.follow import JOB_NAME_LABEL
from launcher.backends.kuberay.follow import _reach as reach  # the run's RayJob, read once
from launcher.backends.kuberay.heal import RAY_CLUSTER_LABEL
from launcher.errors import BadInput, InfraError
from launcher.state import RunRecord, private_dir, write_private

NODE_TYPE_LABEL = "ray.io/node-type"  # KubeRay's head/worker label on every Ray pod
LOG_FILE = "stdout.log"  # kubectl-ray's name for a pod's container log
TAIL_LINES = 200_000  # the most lines one pod's log is asked for: the server never sends a whole day's log
LIST_TIMEOUT_S = 10.0
CONNECT_S = 5.0
_ORDER = {"head": 0, "submitter": 1, "worker": 2}
ALL_NODES_BYTES = 64 * 2**20  # `launcher logs --all-nodes`: every pod's log together, at most this
ALL_NODES_S = 120.0  # and within this long


def run_pod_logs(record: RunRecord) -> NodeLogs:
    """`launcher logs --all-nodes` of a KubeRay run: its RayJob's pods now, their logs saved under the run's
    directory (`pod-logs/<time>/`). BadInput when the RayJob or its pods are gone, or the API refuses."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    follower, obj = reach(record)
    if obj is None:
        raise BadInput(f"run_id: the RayJob {record.run_id} is gone (deleted), and its pods' logs with it; its "
                       f"driver's log is saved: `launcher logs {record.run_id}`")
    cluster = (obj.get("status") or {}).get("rayClusterName")
    try:
        pods = ray_pods(follower.core, follower.namespace, follower.name, cluster)
    except (ApiException, HTTPError) as exc:
        raise api_error(exc, follower.access, "list pods", follower.namespace) from None
    if not pods:
        raise BadInput(f"run_id: the RayJob {record.run_id} has no pod in namespace {follower.namespace} now (not "
                       f"started, queued, or its cluster shut down); its driver's log: `launcher logs {record.run_id}`")
    directory = record.directory / "pod-logs" / time.strftime("%Y%m%d-%H%M%S")
    gathered = gather(follower.core, follower.namespace, pods, directory, ALL_NODES_BYTES,
                      time.monotonic() + ALL_NODES_S)
    if not gathered.pods:
        raise InfraError(f"kubernetes: no log of the {len(pods)} pod(s) of RayJob {record.run_id} could be read "
                         f"({gathered.errors[0]}); the launcher's account needs `get pods/log`")
    return gathered


def ray_pods(core: Any, namespace: str, rayjob: str, cluster: str | None) -> list[tuple[str, str, str]]:
    """(pod, container, role) of the RayJob's current RayCluster and its submitter: head, submitter, workers.
    The container is the pod's first, as kubectl-ray reads it."""
    selectors = ([f"{RAY_CLUSTER_LABEL}={cluster}"] if cluster else []) + [f"{JOB_NAME_LABEL}={rayjob}"]
    found: dict[str, tuple[str, str, str]] = {}
    for selector in selectors:
        answer = core.list_namespaced_pod(namespace, label_selector=selector, _request_timeout=LIST_TIMEOUT_S,
                                          _preload_content=False)
        try:
            items = json.loads(answer.data).get("items") or []
        finally:
            answer.release_conn()
        for item in items:
            metadata = item.get("metadata") or {}
            containers = (item.get("spec") or {}).get("containers") or [{}]
            labels = metadata.get("labels") or {}
            role = labels.get(NODE_TYPE_LABEL) or ("submitter" if JOB_NAME_LABEL in labels else "worker")
            name = str(metadata.get("name") or "")
            if name and "/" not in name and name not in (".", ".."):  # a directory of its own, nothing else
                found.setdefault(name, (name, str(containers[0].get("name") or ""), role))
    return sorted(found.values(), key=lambda pod: (_ORDER.get(pod[2], 3), pod[0]))


def gather(core: Any, namespace: str, pods: list[tuple[str, str, str]], directory: Path, cap_bytes: int,
           deadline: float) -> NodeLogs:
    """Each pod's log saved under `directory/<pod>/stdout.log`, all of them within `cap_bytes` and by the
    monotonic `deadline`. Never raises for a pod: what was not read is in `errors`."""
    private_dir(directory)
    result = NodeLogs(str(directory), cap_bytes)
    for index, (pod, container, _) in enumerate(pods):
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            result.errors += [f"{name}: not read by the deadline" for name, _, _ in pods[index:]]
            break
        share = (cap_bytes - result.written) // (len(pods) - index)  # what an earlier pod left goes on
        try:
            text, cut = _tail(core, namespace, pod, container, share, deadline)
        except Exception as exc:  # noqa: BLE001 - foreign input: a pod's log that cannot be read is said, not raised
            result.errors.append(f"{pod}: {why(exc)}")
            continue
        private_dir(directory / pod)
        write_private(directory / pod / LOG_FILE, text)
        result.pods.append(pod)
        result.written += len(text)
        if cut:
            result.cut.append(pod)
    write_private(directory / "summary.json", json.dumps(result.as_dict(), indent=2))
    return result


def _tail(core: Any, namespace: str, pod: str, container: str, share: int, deadline: float) -> tuple[bytes, bool]:
    """The last `share` bytes of a container's log (of at most TAIL_LINES lines), read by `deadline`; whether
    the log was longer."""
    response = core.read_namespaced_pod_log(pod, namespace, container=container or None, tail_lines=TAIL_LINES,
                                            _preload_content=False,
                                            _request_timeout=(CONNECT_S, max(0.1, deadline - time.monotonic())))
    kept, seen = bytearray(), 0
    try:
        for chunk in response.stream(64 * 1024):
            seen += len(chunk)
            kept += chunk
            if len(kept) > 2 * share:  # memory stays within twice the share
                del kept[:len(kept) - share]
            if time.monotonic() > deadline:
                raise TimeoutError("the deadline passed mid-log")
    finally:
        response.release_conn()
    if len(kept) > share:
        del kept[:len(kept) - share]
    return bytes(kept), seen > share


def why(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status:
        try:
            message = json.loads(getattr(exc, "body", "") or "").get("message")
        except (TypeError, ValueError, AttributeError):
            message = None
        return f"{status} {getattr(exc, 'reason', '')}".strip() + (f": {message}" if message else "")
    return f"{type(exc).__name__}: {exc}"[:160]
