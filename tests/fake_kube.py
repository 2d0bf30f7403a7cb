"""A small Kubernetes API server of our own (aiohttp, TLS from trustme, a bearer token) for the KubeRay
tests, driven through the real kubernetes client: create, get, list, merge-patch, delete and WATCH of
namespaced objects (RayJobs, Secrets, PodMonitors, Jobs, pods), pod logs (followed too), watches the
server closes every `watch_close_s` and a compacted history (410 Gone, compact()), and KubeRay's state
machine for each RayJob created, from a script the test gives per RayJob name.

KubeRay's semantics kept here (rayjob_types.go / rayjob_controller.go, ray-project/kuberay master): the
deployment status moves New -> Initializing -> Running -> Complete | Failed; the jobId (spec.jobId when
given) and the RayCluster's name are set at New -> Initializing, before any cluster or submitter exists
(initRayJobStatusIfNeed); with retries left (spec.backoffLimit) a failed attempt is stored as
`jobStatus: FAILED` with `jobDeploymentStatus: Retrying`, whose cleanup resets the jobId and goes to New,
so the next attempt gets a new `status.jobId` at Initializing (the `JobDeploymentStatusSuspending,
JobDeploymentStatusRetrying` case); on activeDeadlineSeconds the deployment fails with reason
DeadlineExceeded while `jobStatus` stays RUNNING; ValidationFailed comes before any attempt. Kueue: a
RayJob with Kueue's queue label is created with spec.suspend true (Kueue's webhook); KubeRay names it at
Initializing all the same, then suspends it (updateStatusToSuspendingIfNeeded: Suspending -> Suspended,
its RayCluster and submitter Job deleted, jobId, rayClusterName and jobStatus reset); admit() (suspend
false) takes Suspended -> New -> Initializing with a new jobId. preempt() (Kueue's preemption: suspend
true on a running RayJob) goes through the same Suspending -> Suspended; a HOLD attempt runs until then,
and once admitted again the script's next attempt runs under a new jobId on a new RayCluster. The driver's output is the
log of the submitter Job's (`<RayJob name>`, one per attempt) pod, which the Job controller creates after
KubeRay created the Job and set Running (`Attempt.pod_after_s`: a pod that waits for a node), labelled
`batch.kubernetes.io/job-name=<RayJob name>`.

For healing (launcher/backends/kuberay/heal.py): with `nodes` (Kubernetes node name -> the base URL of a
real HTTP server standing in for the raypulse sidecar on that node), each attempt's RayCluster gets a Ray
pod labelled `ray.io/cluster=<status.rayClusterName>` on the first node that is not cordoned
(spec.unschedulable), and the pod proxy (`pods/<pod>:<port>/proxy/<path>`, whatever the port) forwards to
that node's server as the API server does (503 when nothing answers; every header but Authorization goes
on). Nodes are cluster-scoped objects (get, merge-patch). With `delete_delay_s`, a deleted RayJob stays that
long with metadata.deletionTimestamp set before it and its pods go (KubeRay's `ray.io/rayjob-finalizer` and a
foreground deletion wait for what it owns: rayjob_controller.go's finalizer branch; the API's DELETE answers
202 with the object while it is being deleted). A RayJob deleted and applied again under the same
name goes on with its script's next attempt.

Outages (`outage(seconds)`): every request answers 503 ServiceUnavailable and the open watches end, as a
kube-apiserver behind its load balancer does while it restarts (the client sees a closed stream, then
503s or refused connections); KubeRay's controller goes on meanwhile (the RayJobs' scripts keep running),
so a watch opened again afterwards from a known resourceVersion gets only what changed since.

Throttling (`throttle(seconds, retry_after)`): every request answers 429 TooManyRequests with a
`Retry-After` header, as kube-apiserver's API Priority and Fairness (and its max-in-flight filter) does
when a flow's queue is full (k8s.io/apiserver/pkg/server/filters/maxinflight.go and
endpoints/handlers/responsewriters/errors.go: 429, `Retry-After: 1` by default). Conflicts
(`conflicts = N`): the next N changes (PATCH, DELETE) of a RayJob answer 409 Conflict with the API's own
message ("the object has been modified; please apply your changes to the latest version and try again"),
as an update of an object whose resourceVersion moved does.

Pods and their logs (core/v1, https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/
"read log of the specified Pod", PodLogOptions): pods are listed by label selector
(`GET /api/v1/namespaces/NS/pods?labelSelector=a=b,c=d`); a Ray pod carries KubeRay's labels
(`ray.io/cluster`, `ray.io/node-type`: raycluster_controller.go's pod template) with the Ray container first
and the sidecar second, `workers` worker pods beside the head; `GET .../pods/NAME/log` takes `container`
(400 when a pod of several containers is asked without one, or for one it has not), `tailLines`, then
`limitBytes`, and `follow`; a pod deleted with its RayCluster answers 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import secrets
import ssl
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import trustme
import yaml
from aiohttp import web

from launcher.backends.kuberay.follow import JOB_NAME_LABEL
from launcher.backends.kuberay.render import KUEUE_QUEUE_LABEL
from scripts.ports import free_port

TOKEN = "fake-service-account-token"
RAY_CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"


@dataclass
class Attempt:
    """One KubeRay attempt: how it ends, and what its driver prints."""

    outcome: str = "SUCCEEDED"  # SUCCEEDED, FAILED, STOPPED, DEADLINE, or HOLD (runs until deleted or suspended)
    log: list[str] = field(default_factory=lambda: ["step 1", "step 2"])
    # Its driver prints only once somebody follows its pod's log (at most FOLLOW_WAIT_S): a job that runs long
    # enough for its log to be read, as real ones do, whatever the machine's load does to the follower.
    until_followed: bool = False
    # The submitter Job's pod comes this long after the attempt is Running (the Job controller's pod waits for a
    # node: a GPU node's scale-up takes minutes); its log is readable from then.
    pod_after_s: float = 0.0


FOLLOW_WAIT_S = 60.0


VALIDATION_FAILED = "ValidationFailed"


def kubeconfig(path: Path, *, server: str, ca_file: Path | None, context: str, namespace: str | None = None,
               current: str | None = None, token: str = TOKEN) -> Path:
    cluster: dict[str, Any] = {"server": server}
    if ca_file:
        cluster["certificate-authority"] = str(ca_file)
    entry: dict[str, Any] = {"cluster": f"{context}-cluster", "user": f"{context}-user"}
    if namespace:
        entry["namespace"] = namespace
    config = {"apiVersion": "v1", "kind": "Config",
              "clusters": [{"name": f"{context}-cluster", "cluster": cluster}],
              "contexts": [{"name": context, "context": entry}],
              "users": [{"name": f"{context}-user", "user": {"token": token}}]}
    if current:
        config["current-context"] = current
    path.write_text(yaml.safe_dump(config))
    return path


def launcher_env(home: Path, ca: trustme.CA, server: FakeApiServer, namespace: str) -> dict[str, str]:
    """The environment of a launcher that talks to `server`: a kubeconfig whose current context is in
    `namespace`, trusting `ca`, under `home` (also RAYPULSE_HOME's parent); no in-cluster variables."""
    ca_file = home / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    config = kubeconfig(home / "config", server=server.url, ca_file=ca_file, context="team", namespace=namespace,
                        current="team")
    clean = {key: value for key, value in os.environ.items() if not key.startswith("KUBERNETES_")}
    return {**clean, "KUBECONFIG": str(config), "RAYPULSE_HOME": str(home / "home")}


def launcher(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m launcher ARGS` in the environment of launcher_env, its output captured."""
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent, env=env, timeout=timeout)


def launching(env: dict[str, str], *args: str) -> subprocess.Popen:
    """`python -m launcher ARGS` in the environment of launcher_env, left running (its output piped) for the
    test to act on."""
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=Path(__file__).resolve().parent.parent,
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge patch (RFC 7386): null deletes, objects merge, the rest replaces."""
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _matches(obj: dict[str, Any], field_selector: str | None, label_selector: str | None) -> bool:
    for selector, values in ((field_selector, {"metadata.name": obj["metadata"]["name"]}),
                             (label_selector, obj["metadata"].get("labels") or {})):
        for term in filter(None, (term.strip() for term in (selector or "").split(","))):
            key, _, wanted = term.partition("=")
            if values.get(key) != wanted:
                return False
    return True


class FakeApiServer:
    """The API server; every request is recorded in `requests`; `scripts[name]` is a RayJob's script (a list
    of Attempts, or VALIDATION_FAILED; default: one attempt that succeeds)."""

    def __init__(self, ca: trustme.CA, token: str = TOKEN, step_s: float = 0.05, watch_close_s: float = 1.0,
                 nodes: dict[str, str] | None = None, workers: int = 0) -> None:
        self.token = token
        self.workers = workers  # worker pods beside each RayCluster's head, on its node
        self.crd_installed = True
        # A deleted RayJob stays this long (metadata.deletionTimestamp set) before it goes: KubeRay's
        # ray.io/rayjob-finalizer and a foreground deletion wait for its pods to stop (rayjob_controller.go).
        self.delete_delay_s = 0.0
        self.step_s = step_s
        self.watch_close_s = watch_close_s  # a watch is closed by the server after this long (as real ones are)
        self.scripts: dict[str, list[Attempt] | str] = {}
        self.nodes = dict(nodes or {})  # Kubernetes node -> base URL of the sidecar exporter its Ray pods serve
        self._proxied: dict[str, str] = {}  # Ray pod name -> base URL its proxy forwards to
        self._consumed: dict[str, int] = {}  # RayJob name -> script attempts used by earlier RayJobs of the name
        self._clusters = 0
        self.requests: list[tuple[str, str, Any]] = []
        self.objects: dict[str, dict[str, Any]] = {}  # path of the object -> object
        self.watches = 0  # watch requests served
        self._compacted = 0  # a watch from a resourceVersion older than this answers 410 Gone (compact())
        self.expired = 0  # watches answered 410 Gone
        self._down_until = 0.0  # monotonic time an outage ends (outage())
        self.refused = 0  # requests answered 503 during outages
        self._throttled_until = 0.0  # monotonic time a throttle ends (throttle())
        self._retry_after = 1
        self.throttled = 0  # requests answered 429
        self.conflicts = 0  # the next changes of a RayJob answered 409 Conflict
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(self._ssl)
        self._version = 0
        self._history: list[tuple[int, str, str, dict[str, Any]]] = []  # (version, collection, type, object)
        self._logs: dict[str, list[str]] = {}  # pod path -> lines (of its only or first container)
        self._container_logs: dict[tuple[str, str], list[str]] = {}  # (pod path, a later container) -> lines
        self._followed: dict[str, asyncio.Event] = {}  # pod path -> set once its log is followed
        self._ended: set[str] = set()  # pods whose container exited
        self._machines: dict[str, asyncio.Task] = {}
        self._loop = asyncio.new_event_loop()
        self._changed: asyncio.Condition | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        assert self._started.wait(10), "the fake API server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        async def cancel_all() -> None:
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=5) if tasks else None

        asyncio.run_coroutine_threadsafe(cancel_all(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get(f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}")

    def node(self, name: str) -> dict[str, Any]:
        return self.objects[f"/api/v1/nodes/{name}"]

    def ray_pods(self, namespace: str) -> list[dict[str, Any]]:
        return [obj for key, obj in self.objects.items() if key.startswith(f"/api/v1/namespaces/{namespace}/pods/")
                and RAY_CLUSTER_LABEL in (obj["metadata"].get("labels") or {})]

    def compact(self, namespace: str) -> None:
        """etcd's compaction: every resourceVersion up to now is too old to watch from (410 Gone); the
        change that follows (a pod's, not the RayJob's) is where a new list starts."""
        async def compact() -> None:
            self._compacted = self._version + 1
            await self._store(f"/api/v1/namespaces/{namespace}/configmaps/compacted", "ADDED", {
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "compacted", "namespace": namespace}})

        asyncio.run_coroutine_threadsafe(compact(), self._loop).result(10)

    def outage(self, seconds: float) -> None:
        """From now on for `seconds`: every request 503, the open watches closed."""
        self._down_until = time.monotonic() + seconds

        async def wake() -> None:  # the open watches see the outage and end
            assert self._changed is not None
            async with self._changed:
                self._changed.notify_all()

        asyncio.run_coroutine_threadsafe(wake(), self._loop).result(10)

    def throttle(self, seconds: float, retry_after: int = 1) -> None:
        """From now on for `seconds`: every request 429 with `Retry-After: retry_after`."""
        self._retry_after = retry_after
        self._throttled_until = time.monotonic() + seconds

    @property
    def down(self) -> bool:
        return time.monotonic() < self._down_until

    def admit(self, namespace: str, name: str) -> None:
        """Kueue admits a queued RayJob: spec.suspend false."""
        async def unsuspend() -> None:
            path = f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}"
            self.objects[path]["spec"]["suspend"] = False
            await self._store(path, "MODIFIED", self.objects[path])

        asyncio.run_coroutine_threadsafe(unsuspend(), self._loop).result(10)

    def preempt(self, namespace: str, name: str) -> None:
        """Kueue preempts an admitted RayJob: spec.suspend true (KubeRay suspends it; admit() lets it run again)."""
        async def suspend() -> None:
            path = f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}"
            self.objects[path]["spec"]["suspend"] = True
            await self._store(path, "MODIFIED", self.objects[path])

        asyncio.run_coroutine_threadsafe(suspend(), self._loop).result(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._changed = asyncio.Condition()
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=self._ssl).start())
        for node in self.nodes:
            self.objects[f"/api/v1/nodes/{node}"] = {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": node, "resourceVersion": "1"}, "spec": {}}
        self._started.set()
        self._loop.run_forever()

    # --- objects and their history ----------------------------------------------------------------

    async def _store(self, path: str, kind: str, obj: dict[str, Any] | None) -> None:
        """One change: a new resourceVersion, kept in the history that watches replay."""
        self._version += 1
        if obj is None:
            obj = self.objects.pop(path)
        else:
            obj["metadata"]["resourceVersion"] = str(self._version)
            self.objects[path] = obj
        self._history.append((self._version, path.rsplit("/", 1)[0], kind, copy.deepcopy(obj)))
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _status(self, path: str, **status: Any) -> bool:
        obj = self.objects.get(path)
        if obj is None:
            return False
        obj.setdefault("status", {}).update(status)
        await self._store(path, "MODIFIED", obj)
        return True

    # --- KubeRay -----------------------------------------------------------------------------------

    async def _kuberay(self, path: str) -> None:
        obj = self.objects[path]
        name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
        script = self.scripts.get(name, [Attempt()])
        await asyncio.sleep(self.step_s)
        await self._initializing(path)  # New -> Initializing names the attempt first, suspended or not
        if script == VALIDATION_FAILED:
            await self._status(path, jobDeploymentStatus=VALIDATION_FAILED, reason=VALIDATION_FAILED,
                               message="invalid RayJob spec: the head group needs a container")
            return
        await self._queued(path)  # Kueue's webhook suspended it: Suspending -> Suspended until admit()
        script = script[self._consumed.get(name, 0):]  # applied again after a delete: the script goes on
        retries = int(obj["spec"].get("backoffLimit") or 0)
        failed = 0
        for number, attempt in enumerate(script, 1):
            self._consumed[name] = self._consumed.get(name, 0) + 1
            cluster = obj["status"]["rayClusterName"]
            await self._ray_pod(namespace, cluster)
            job = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"  # the submitter Job, one per attempt
            await self._store(job, "ADDED", {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
                "name": name, "namespace": namespace, "uid": str(uuid.uuid4())}, "status": {"active": 1}})
            await self._status(path, jobDeploymentStatus="Running", jobStatus="PENDING", failed=failed)
            await asyncio.sleep(attempt.pod_after_s)
            pod = f"/api/v1/namespaces/{namespace}/pods/{name}-{secrets.token_hex(3)}"
            self._logs[pod] = []
            await self._store(pod, "ADDED", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod.rsplit("/", 1)[1], "namespace": namespace, "uid": str(uuid.uuid4()),
                             "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "labels": {JOB_NAME_LABEL: name}},
                "status": {"phase": "Running"}})
            await asyncio.sleep(self.step_s)
            await self._status(path, jobStatus="RUNNING")
            if attempt.until_followed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._followed.setdefault(pod, asyncio.Event()).wait(), FOLLOW_WAIT_S)
            for line in attempt.log:
                self._logs[pod].append(line + "\n")
                await asyncio.sleep(self.step_s)
            if attempt.outcome == "HOLD":  # until suspended (a stop under Kueue, or Kueue's preemption)
                while path in self.objects and not self.objects[path]["spec"].get("suspend"):
                    await asyncio.sleep(self.step_s)
                self._ended.add(pod)
                await self._suspend(path, job)
                await self._queued(path, suspending=False)
                continue  # admitted again: the script's next attempt, a new jobId on a new RayCluster
            self._ended.add(pod)
            if attempt.outcome == "SUCCEEDED":
                await self._status(path, jobStatus="SUCCEEDED", jobDeploymentStatus="Complete", succeeded=1)
                return
            if attempt.outcome == "STOPPED":
                await self._status(path, jobStatus="STOPPED", jobDeploymentStatus="Complete")
                return
            if attempt.outcome == "DEADLINE":  # jobStatus stays RUNNING
                await self._status(path, jobDeploymentStatus="Failed", reason="DeadlineExceeded",
                                   message="The RayJob has passed the activeDeadlineSeconds. DeadlineExceeded")
                return
            failed += 1
            if failed <= retries and number < len(script):  # KubeRay retries; the script says how that ends
                await self._status(path, jobStatus="FAILED", jobDeploymentStatus="Retrying", failed=failed)
                await asyncio.sleep(self.step_s)
                await self._store(pod, "DELETED", None)  # a retry deletes the submitter Job and its pod
                await self._store(job, "DELETED", None)
                await self._status(path, jobDeploymentStatus="New", jobStatus="", jobId="", rayClusterName="")
                await self._initializing(path)
                continue
            await self._status(path, jobStatus="FAILED", jobDeploymentStatus="Failed", reason="AppFailed",
                               message="Job failed: the driver exited with code 1", failed=failed)
            return

    async def _initializing(self, path: str) -> None:
        """initRayJobStatusIfNeed: the attempt's jobId (spec.jobId if given, which KubeRay reuses) and its
        RayCluster's name, before any cluster or submitter exists."""
        obj = self.objects.get(path)
        if obj is None:
            return
        name = obj["metadata"]["name"]
        self._clusters += 1
        await self._status(path, jobDeploymentStatus="Initializing", jobStatus="",
                           jobId=obj["spec"].get("jobId") or f"{name}-{secrets.token_hex(4)}",
                           rayClusterName=f"{name}-raycluster-{self._clusters}")

    async def _suspend(self, path: str, job: str | None = None) -> None:
        """Suspending -> Suspended (updateStatusToSuspendingIfNeeded, then the Suspending case): the RayCluster
        and the submitter Job deleted, the jobId, cluster name and job status reset."""
        await self._status(path, jobDeploymentStatus="Suspending")
        obj = self.objects.get(path)
        cluster = ((obj or {}).get("status") or {}).get("rayClusterName")
        for key in [key for key, pod in self.objects.items() if cluster and key.startswith("/api/v1/namespaces/")
                    and (pod["metadata"].get("labels") or {}).get(RAY_CLUSTER_LABEL) == cluster]:
            await self._store(key, "DELETED", None)
        if job is not None and job in self.objects:
            await self._store(job, "DELETED", None)
        await self._status(path, jobDeploymentStatus="Suspended", jobStatus="", jobId="", rayClusterName="",
                           message="", reason="")

    async def _queued(self, path: str, suspending: bool = True) -> None:
        """While spec.suspend is true (Kueue has not admitted it): Suspended; once admitted (admit()), the
        Suspended case goes to New and New to Initializing with a new jobId."""
        obj = self.objects.get(path)
        if obj is None or not obj["spec"].get("suspend"):
            return
        if suspending:
            await self._suspend(path)
        while path in self.objects and self.objects[path]["spec"].get("suspend"):
            await asyncio.sleep(self.step_s)
        if path in self.objects:
            await self._status(path, jobDeploymentStatus="New")
            await self._initializing(path)

    async def _ray_pod(self, namespace: str, cluster: str) -> None:
        """The RayCluster's Ray pods, labelled as KubeRay labels them (`ray.io/cluster`, `ray.io/node-type`), the
        Ray container first: the head, scheduled on the first node not cordoned (none without `nodes`), and
        `workers` worker pods beside it. Each container's log says what it is."""
        free = [node for node in self.nodes if not self.objects[f"/api/v1/nodes/{node}"]["spec"].get("unschedulable")]
        if not free:
            return
        for role, name in [("head", f"{cluster}-head")] + [
                ("worker", f"{cluster}-worker-{index}") for index in range(self.workers)]:
            self._proxied[name] = self.nodes[free[0]]  # each pod's sidecar: that node's server
            path = f"/api/v1/namespaces/{namespace}/pods/{name}"
            ray, sidecar = f"ray-{role}", "raypulse-exporter"
            self._logs[path] = [f"{name} {ray}: Ray runtime started\n"]
            self._container_logs[(path, sidecar)] = [f"{name} {sidecar}: serving\n"]
            await self._store(path, "ADDED", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                             "labels": {RAY_CLUSTER_LABEL: cluster, NODE_TYPE_LABEL: role}},
                "spec": {"nodeName": free[0], "containers": [{"name": ray, "image": "rayproject/ray"},
                                                              {"name": sidecar, "image": "raypulse"}]},
                "status": {"phase": "Running"}})

    def append_log(self, namespace: str, pod: str, text: str, container: str | None = None) -> None:
        """More output of a pod's container (its first without `container`)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}"
        first = ((self.objects[path].get("spec") or {}).get("containers") or [{}])[0].get("name")
        lines = self._logs[path] if container in (None, first) else self._container_logs[(path, str(container))]
        self._loop.call_soon_threadsafe(lines.append, text)

    async def _proxy(self, request: web.Request, pod: str, rest: list[str]) -> web.StreamResponse:
        """The pod proxy: the request's path and query forwarded to the pod's server, its answer passed back
        as it came (status, ETag, Content-Encoding, body)."""
        name = pod.rpartition(":")[0].removeprefix("https:")
        if name not in self._proxied:
            return self._error(404, "NotFound", f'pods "{name}" not found', "pods", name)
        url = self._proxied[name] + "/" + "/".join(rest) + (f"?{request.query_string}" if request.query_string else "")
        # The request's headers go on, but the API server's own credentials (its authentication filter removes
        # Authorization) and what belongs to the hop.
        headers = {key: value for key, value in request.headers.items()
                   if key.lower() not in ("authorization", "host", "connection", "content-length")}
        try:
            async with aiohttp.ClientSession(auto_decompress=False) as session, \
                    session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as answer:
                body = await answer.read()
                kept = {key: answer.headers[key] for key in ("ETag", "Content-Encoding", "Content-Type")
                        if key in answer.headers}
                return web.Response(status=answer.status, body=body, headers=kept)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return self._error(503, "ServiceUnavailable", f"error trying to reach service: {type(exc).__name__}")

    # --- HTTP --------------------------------------------------------------------------------------

    @staticmethod
    def _error(code: int, reason: str, message: str, kind: str | None = None, name: str | None = None) -> web.Response:
        details = {"kind": kind, "name": name} if kind else {}
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                                  "reason": reason, "details": details, "code": code}, status=code)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else None
        path = request.path.rstrip("/")
        self.requests.append((request.method, request.path, body))
        if self.down:
            self.refused += 1
            return self._error(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        if time.monotonic() < self._throttled_until:
            self.throttled += 1
            response = self._error(429, "TooManyRequests", "Too many requests, please try again later.")
            response.headers["Retry-After"] = str(self._retry_after)
            return response
        if self.conflicts and request.method in ("PATCH", "DELETE") and "/rayjobs/" in path:
            self.conflicts -= 1
            return self._error(409, "Conflict", "Operation cannot be fulfilled on rayjobs.ray.io: the object has "
                               "been modified; please apply your changes to the latest version and try again",
                               "rayjobs", path.rsplit("/", 1)[-1])
        if request.headers.get("Authorization", "").removeprefix("Bearer ").removeprefix("bearer ") != self.token:
            return self._error(401, "Unauthorized", "Unauthorized")
        if path == "/version":
            return web.json_response({"major": "1", "minor": "33", "gitVersion": "v1.33.0"})
        parts = path.strip("/").split("/")  # api/v1/namespaces/NS/R[/NAME[/log]], apis/G/V/namespaces/NS/R[/NAME]
        group = parts[:2] if parts[0] == "api" else parts[:3]
        rest = parts[len(group):]
        if group[:2] == ["apis", "ray.io"] and not self.crd_installed:
            return web.Response(status=404, text="404 page not found")
        if rest[:1] == ["nodes"] and len(rest) == 2 and path in self.objects:  # cluster-scoped: get, patch
            if request.method == "PATCH" and isinstance(body, dict):
                _merge(self.objects[path], body)
                await self._store(path, "MODIFIED", self.objects[path])
            return web.json_response(self.objects[path])
        if len(rest) < 3 or rest[0] != "namespaces":
            return self._error(404, "NotFound", "not here")
        if len(rest) >= 5 and rest[2] == "pods" and rest[4] == "proxy" and request.method == "GET":
            return await self._proxy(request, rest[3], rest[5:])
        resource, query = rest[2], request.query
        if len(rest) == 3 and request.method == "GET":
            if query.get("watch") in ("true", "1"):
                return await self._watch(request, path)
            items = [obj for key, obj in self.objects.items() if key.rsplit("/", 1)[0] == path
                     and _matches(obj, query.get("fieldSelector"), query.get("labelSelector"))]
            return web.json_response({"kind": "List", "apiVersion": "v1", "items": items,
                                      "metadata": {"resourceVersion": str(self._version)}})
        if len(rest) == 3 and request.method == "POST":
            key = f"{path}/{body['metadata']['name']}"
            if key in self.objects:
                return self._error(409, "AlreadyExists", "already exists", resource, body["metadata"]["name"])
            if resource == "rayjobs" and KUEUE_QUEUE_LABEL in (body["metadata"].get("labels") or {}):
                body["spec"]["suspend"] = True  # what Kueue's admission webhook does to a queued RayJob
            await self._store(key, "ADDED", {**body, "metadata": {**body["metadata"], "namespace": rest[1],
                                                                  "uid": str(uuid.uuid4())}})
            if resource == "rayjobs":
                self._machines[key] = asyncio.ensure_future(self._kuberay(key))
            return web.json_response(self.objects[key], status=201)
        if len(rest) == 5 and rest[4] == "log" and resource == "pods":
            return await self._log(request, path.rsplit("/", 1)[0])
        if len(rest) == 4 and path in self.objects:
            if request.method == "GET":
                return web.json_response(self.objects[path])
            if request.method == "PATCH" and isinstance(body, dict):
                stored = self.objects[path]
                _merge(stored, body)
                await self._store(path, "MODIFIED", stored)
                return web.json_response(stored)
            if request.method == "DELETE":
                if self.delete_delay_s and resource == "rayjobs":  # the finalizer and foreground deletion take time
                    stored = self.objects[path]
                    stored["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                    await self._store(path, "MODIFIED", stored)
                    self._machines[f"{path}#delete"] = asyncio.ensure_future(self._remove_later(path, rest[1]))
                    return web.json_response(stored, status=202)
                await self._remove(path, rest[1])
                return web.json_response({"kind": "Status", "status": "Success"})
        return self._error(404, "NotFound", f"{resource} not found", resource, rest[3] if len(rest) > 3 else None)

    async def _remove_later(self, path: str, namespace: str) -> None:
        await asyncio.sleep(self.delete_delay_s)
        if path in self.objects:
            await self._remove(path, namespace)

    async def _remove(self, path: str, namespace: str) -> None:
        """An object deleted; a RayJob with its submitter pod and its RayCluster's pods (KubeRay's finalizer and
        the garbage collector)."""
        obj = self.objects[path]
        machine = self._machines.pop(path, None)
        if machine is not None:
            machine.cancel()
            for pod in self._logs:  # the RayJob's pods go with it
                if pod in self.objects and self.objects[pod]["metadata"]["labels"].get(JOB_NAME_LABEL) \
                        == obj["metadata"]["name"]:
                    self._ended.add(pod)
            cluster = (obj.get("status") or {}).get("rayClusterName")
            for key in [key for key, pod in self.objects.items() if cluster and key.startswith(
                    f"/api/v1/namespaces/{namespace}/pods/") and (pod["metadata"].get("labels") or {}).get(
                    RAY_CLUSTER_LABEL) == cluster]:  # and its RayCluster's
                await self._store(key, "DELETED", None)
        await self._store(path, "DELETED", None)

    async def _watch(self, request: web.Request, collection: str) -> web.StreamResponse:
        """Events of the collection's matching objects after resourceVersion (none given: the current ones as
        ADDED), until the server closes the watch (watch_close_s, or the client's timeoutSeconds)."""
        self.watches += 1
        query = request.query
        since = int(query.get("resourceVersion") or 0)
        limit = min(float(query.get("timeoutSeconds", self.watch_close_s)), self.watch_close_s)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(kind: str, obj: dict[str, Any]) -> None:
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        if since and since < self._compacted:  # the history is gone: the client must list again
            self.expired += 1
            await send("ERROR", {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                                 "reason": "Expired", "message": f"too old resource version: {since}"})
            await response.write_eof()
            return response
        if not since:
            for key, obj in list(self.objects.items()):
                if key.rsplit("/", 1)[0] == collection and _matches(obj, query.get("fieldSelector"), None):
                    await send("ADDED", obj)
            since = self._version
        deadline = time.monotonic() + limit
        assert self._changed is not None
        while (left := deadline - time.monotonic()) > 0 and not self.down:
            for version, where, kind, obj in [event for event in self._history if event[0] > since]:
                since = version
                if where == collection and _matches(obj, query.get("fieldSelector"), None):
                    await send(kind, obj)
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except TimeoutError:
                    break
        await response.write_eof()
        return response

    async def _log(self, request: web.Request, pod: str) -> web.StreamResponse:
        """The log subresource as the API serves it (core/v1 PodLogOptions, `kubectl logs`): `container` (required
        when the pod has several, 400 when the pod has no such container), `tailLines` (the last N lines), then
        `limitBytes` (the output stops after N bytes, mid-line if need be), `follow`. A Ray pod deleted with its
        RayCluster is 404 (an ended submitter pod's log stays readable, as a terminated pod's does)."""
        if pod not in self._logs or (pod not in self.objects and pod not in self._ended):
            return self._error(404, "NotFound", f'pods "{pod.rsplit("/", 1)[1]}" not found', "pods",
                               pod.rsplit("/", 1)[1])
        query, name = request.query, pod.rsplit("/", 1)[1]
        names = [item.get("name") for item in ((self.objects.get(pod) or {}).get("spec") or {}).get("containers") or []]
        container = query.get("container")
        if container is None and len(names) > 1:
            return self._error(400, "BadRequest", f"a container name must be specified for pod {name}, choose one "
                               f"of: [{' '.join(names)}]")
        if container is not None and names and container not in names:
            return self._error(400, "BadRequest", f"container {container} is not valid for pod {name}")
        lines = self._logs[pod] if container in (None, *names[:1]) else self._container_logs[(pod, container)]
        tail = int(query["tailLines"]) if "tailLines" in query else None
        limit = int(query["limitBytes"]) if "limitBytes" in query else None
        if (tail is not None and tail < 0) or (limit is not None and limit < 1):
            return self._error(422, "Invalid", "tailLines must be >= 0 and limitBytes >= 1")
        skipped = max(0, len(lines) - tail) if tail is not None else 0
        if query.get("follow") not in ("true", "1"):
            return web.Response(body="".join(lines[skipped:]).encode()[:limit], content_type="text/plain")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        self._followed.setdefault(pod, asyncio.Event()).set()
        sent, budget = skipped, limit
        while budget is None or budget > 0:
            if sent < len(lines):
                data = "".join(lines[sent:]).encode()[:budget]
                await response.write(data)
                sent = len(lines)
                budget = None if budget is None else budget - len(data)
            elif pod in self._ended:
                break
            else:
                await asyncio.sleep(self.step_s / 2)
        await response.write_eof()
        return response
