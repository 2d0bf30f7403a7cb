"""Healing on KubeRay keeps the evidence: before a restart deletes the RayJob (and every Ray pod with it), the
stacks of the job's processes (through the head pod's Ray dashboard, reached by the API server's pod proxy)
and the Ray pods' logs are saved with the run, bounded; what could not be taken is said once and never holds
the restart past its deadline.

Against our fake API server (tests/fake_kube.py) through the real kubernetes client and the real CLI. The
head pod's proxy reaches one real HTTP server per node, which answers as the raypulse sidecar (/metrics) and
as Ray's dashboard: `GET /api/jobs/{submission_id}` (dashboard/modules/job/job_head.py, JobDetails with
`job_id` and `driver_info`), `GET /api/v0/{actors,tasks}` (dashboard/state_api via state_head.py: rows under
data.result.result, filtered by filter_keys/filter_predicates/filter_values) and `GET /worker/traceback`
(dashboard/modules/reporter/reporter_head.py: py-spy's `dump` text of one pid).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trustme

from tests.conftest import REPO, wait_until
from tests.fake_kube import Attempt, FakeApiServer, launcher, launcher_env

pytest.importorskip("kubernetes")

NAMESPACE = "team-a"
# No output for 10 s is a hang too: far from when a test gives its exporter the steps or the fault it
# judges (a silence hang first would be another fault, from nothing the test set).
HEALTH = ["--health-check-interval", "0.5", "--hang-after", "2", "--silence-after", "10"]
JOB_ID = "02000000"
DRIVER_PID, RANK_PID = 4242, 4243


def py_spy_dump(pid: int, frame: str) -> str:
    """py-spy's `dump` of one Python process, as Ray's /worker/traceback returns it."""
    return (f"Process {pid}: python train.py\nPython v3.11.9 (/usr/bin/python3.11)\n\n"
            f'Thread {pid} (idle): "MainThread"\n    {frame}\n    main (train.py:42)\n')


class SidecarAndDashboard:
    """One node's server behind the pod proxy: the sidecar's /metrics (`text`) and the head's Ray dashboard;
    `hold` (while set) keeps every dashboard request waiting. Records the X-Ray-Authorization it was sent."""

    def __init__(self) -> None:
        self.text = ""
        self.tokens: list[str] = []
        self.hold = threading.Event()
        self.refuse_dumps = False  # answer /worker/traceback as Ray does without RAY_DASHBOARD_ENABLE_PROFILING
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                if url.path == "/metrics":
                    return self._send(200, owner.text.encode(), "text/plain")
                owner.tokens.append(self.headers.get("X-Ray-Authorization") or "")
                while owner.hold.is_set():
                    time.sleep(0.05)
                if url.path.startswith("/api/jobs/"):
                    return self._json({"submission_id": url.path.rsplit("/", 1)[1], "job_id": JOB_ID,
                                       "driver_info": {"id": JOB_ID, "node_ip_address": "10.0.0.7",
                                                       "pid": str(DRIVER_PID)}})
                if url.path in ("/api/v0/actors", "/api/v0/tasks"):
                    rows = [] if "name" in query.get("filter_keys", []) or url.path.endswith("tasks") else [
                        {"actor_id": "a1", "class_name": "RankWorker", "pid": RANK_PID, "node_id": "node-a-raylet",
                         "state": "ALIVE", "job_id": JOB_ID}]
                    return self._json({"result": True, "msg": "", "data": {"result": {"result": rows}}})
                if url.path == "/worker/traceback" and owner.refuse_dumps:
                    return self._send(403, b"Forbidden: profiling is disabled", "text/plain")
                if url.path == "/worker/traceback":
                    pid = int(query["pid"][0])
                    frame = "allreduce (torch/distributed/distributed_c10d.py:2501)" if pid == RANK_PID \
                        else "wait (ray/_private/worker.py:2755)"
                    return self._send(200, py_spy_dump(pid, frame).encode(), "text/plain")
                return self._send(404, b"not found", "text/plain")

            def _json(self, data: Any) -> None:
                self._send(200, json.dumps(data).encode(), "application/json")

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda *_: None  # a request the launcher gave up on (the deadline test)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.hold.clear()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def node() -> Iterator[SidecarAndDashboard]:
    server = SidecarAndDashboard()
    yield server
    server.close()


@pytest.fixture
def api_server(ca: trustme.CA, node: SidecarAndDashboard) -> Iterator[FakeApiServer]:
    with FakeApiServer(ca, watch_close_s=0.3, nodes={"node-a": node.url}, workers=1) as server:
        yield server


@pytest.fixture
def env(tmp_path: Path, ca: trustme.CA, api_server: FakeApiServer) -> dict[str, str]:
    return launcher_env(tmp_path, ca, api_server, NAMESPACE)



def running_job_id(api_server: FakeApiServer, run_id: str) -> str:
    wait_until(lambda: ((api_server.rayjob(NAMESPACE, run_id) or {}).get("status") or {}).get("jobStatus")
               == "RUNNING", 60, "the RayJob to run")
    return api_server.rayjob(NAMESPACE, run_id)["status"]["jobId"]


def training(submission_id: str, step: int) -> str:
    labels = f'job_id="{JOB_ID}",submission_id="{submission_id}",rank="0"'
    return (f"raypulse_train_step{{{labels}}} {step}\n"
            f"raypulse_train_last_progress_time_seconds{{{labels}}} {time.time():.3f}\n")


def test_a_restart_keeps_the_stacks_and_the_pods_logs_taken_before_the_delete(
        env: dict[str, str], api_server: FakeApiServer, node: SidecarAndDashboard):
    api_server.scripts["ev-1"] = [Attempt("HOLD", ["step 41"]), Attempt("SUCCEEDED", ["resumed"])]
    process = subprocess.Popen([sys.executable, "-m", "launcher", "submit", "--backend", "kuberay", "--run-id", "ev-1",
                                "--max-retries", "1", "--retry-backoff", "0", *HEALTH, "--", "python train.py"],
                               cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        node.text = training(running_job_id(api_server, "ev-1"), step=42)
        _, err = process.communicate(timeout=90)
        assert process.returncode == 0, err
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        raise AssertionError(err[-3000:]) from None
    finally:
        process.kill()
    run = json.loads(launcher(env, "status", "ev-1", "-o", "json").stdout)
    [evidence] = [event["details"] for event in run["events"] if event["kind"] == "health.evidence"]
    assert evidence["attempt"] == 1
    assert "stacks: 2 stack(s)" in evidence["summary"]
    assert "allreduce (distributed_c10d.py:2501)" in evidence["summary"]  # the rank's frame, grouped
    assert "logs: 3 pod log(s)" in evidence["summary"]  # head, worker, submitter
    run_dir = Path(evidence["directory"]).parent.parent
    stacks = sorted(path.name for path in (run_dir / "stacks" / "attempt-1").glob("*.txt"))
    assert stacks == [f"10.0.0.7-{DRIVER_PID}-driver.txt", f"node-a-rayle-{RANK_PID}-actor.txt"]  # a node id's first 12
    assert "allreduce" in (run_dir / "stacks" / "attempt-1" / stacks[1]).read_text()
    logs = Path(evidence["directory"]) / "pod-logs"
    [head] = [path for path in logs.iterdir() if path.name.endswith("-head")]
    assert (head / "stdout.log").read_text().endswith("ray-head: Ray runtime started\n")
    submitter = next(path for path in logs.iterdir() if path.is_dir() and "-raycluster-" not in path.name)
    assert (submitter / "stdout.log").read_text() == "step 41\n"
    assert node.tokens
    assert all(token.startswith("Bearer ") and len(token) > len("Bearer ") for token in node.tokens)
    # Taken before the delete: every read of the pods came before the RayJob's DELETE.
    order = [(method, path) for method, path, _ in api_server.requests]
    delete = next(index for index, (method, path) in enumerate(order) if method == "DELETE" and "/rayjobs/" in path)
    first = [path.name for path in logs.iterdir() if path.is_dir()]  # attempt 1's pods
    reads = [index for index, (method, path) in enumerate(order)
             if any(f"/pods/{pod}" in path for pod in first) and (path.endswith("/log") or "/traceback" in path)]
    assert reads
    assert max(reads) < delete
    # `launcher diagnose` reads the stacks where a local run's are.
    diagnosed = launcher(env, "diagnose", "ev-1")
    assert diagnosed.returncode == 0, diagnosed.stderr
    assert "allreduce" in diagnosed.stdout


def kept_in_process(env: dict[str, str], api_server: FakeApiServer, monkeypatch: pytest.MonkeyPatch, run_id: str,
                    deadline_s: float) -> dict[str, Any]:
    """`evidence.keep` of a running RayJob's attempt 1, in this process; the details of its one event."""
    from kubernetes import client

    from launcher.backends.kuberay import evidence
    from launcher.backends.kuberay.access import kube_api
    from launcher.journal import Journal
    from launcher.state import RunRecord

    api_server.scripts[run_id] = [Attempt("HOLD", ["step 1"])]
    assert launcher(env, "submit", "--backend", "kuberay", "--run-id", run_id, "--no-wait", "--",
                    "python train.py").returncode == 0
    submission_id = running_job_id(api_server, run_id)
    for key in ("KUBECONFIG", "RAYPULSE_HOME"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    access = kube_api()
    record = RunRecord(run_id=run_id, name=run_id, backend="kuberay")
    cluster = api_server.rayjob(NAMESPACE, run_id)["status"]["rayClusterName"]
    jobs = SimpleNamespace(core=client.CoreV1Api(access.api_client), access=access, namespace=NAMESPACE,
                           name=run_id, cluster_name=cluster, record=record, journal=Journal(record=record), spec=None,
                           views={1: SimpleNamespace(submission_id=submission_id)})
    evidence.keep(jobs, 1, deadline_s=deadline_s)
    [said] = [event.details for event in record.events if event.kind == "health.evidence"]
    return said


def test_evidence_that_does_not_come_by_the_deadline_is_said_and_the_rest_is_kept(
        env: dict[str, str], api_server: FakeApiServer, node: SidecarAndDashboard, monkeypatch: pytest.MonkeyPatch):
    node.hold.set()  # the dashboard takes every request and never answers while the test holds it
    try:
        # Long enough for the pods' logs on a busy machine; the held dashboard answers none of it.
        said = kept_in_process(env, api_server, monkeypatch, "slow-1", deadline_s=5.0)
    finally:
        node.hold.clear()
    assert "stacks: not done within 5s (the restart goes on)" in said["summary"]
    assert "logs: 3 pod log(s)" in said["summary"]
    assert (Path(said["directory"]) / "pod-logs" / "summary.json").exists()


def test_a_dashboard_that_refuses_stack_dumps_is_named_not_taken_for_rbac(
        env: dict[str, str], api_server: FakeApiServer, node: SidecarAndDashboard, monkeypatch: pytest.MonkeyPatch):
    node.refuse_dumps = True  # the dashboard's own 403, through the proxy: not the API server's RBAC
    said = kept_in_process(env, api_server, monkeypatch, "off-1", deadline_s=30.0)
    assert "RAY_DASHBOARD_ENABLE_PROFILING=1 is not set on the head" in said["summary"]
    assert "get pods/proxy" not in said["summary"]
