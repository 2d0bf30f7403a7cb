"""Healing on KubeRay (`launcher submit --backend kuberay` with a health policy): the watcher reads the Ray
pods' sidecar exporters through the API server's pod proxy, a hang or a GPU fault ends the attempt by
deleting the RayJob and applies it again as the next attempt with RAYPULSE_RESUME_FROM, a faulty GPU's node
is cordoned only when asked, an exporter the proxy cannot reach is news and never a restart, and a stop
while the restart waits leaves nothing applied.

Against our fake API server (tests/fake_kube.py: KubeRay's state machine, Ray pods on nodes, the pod
proxy forwarding to a real HTTP server per node) through the real kubernetes client and the real CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
import yaml

from exporter.contract import wire
from scripts.ports import free_port
from tests.broken_exporters import ExporterLike, RawServer, cut_short, gzip_bomb
from tests.conftest import REPO, wait_until
from tests.fake_kube import Attempt, FakeApiServer, launcher_env

pytest.importorskip("kubernetes")

NAMESPACE = "team-a"
# Checks every half second; a hang after 2 s without progress: the floor is 3 checks. No output for 10 s
# is a hang too: far from when a test gives its exporter the steps or the fault it judges (a silence hang
# first would be another fault, from nothing the test set).
HEALTH = ["--health-check-interval", "0.5", "--hang-after", "2", "--silence-after", "10"]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def exporters() -> Iterator[dict[str, ExporterLike]]:
    servers = {"node-a": ExporterLike(), "node-b": ExporterLike()}
    yield servers
    for server in servers.values():
        server.close()


@pytest.fixture
def api_server(ca: trustme.CA, exporters: dict[str, ExporterLike]) -> Iterator[FakeApiServer]:
    with FakeApiServer(ca, watch_close_s=0.3, nodes={node: server.url for node, server in exporters.items()}) as server:
        yield server


@pytest.fixture
def env(tmp_path: Path, ca: trustme.CA, api_server: FakeApiServer) -> dict[str, str]:
    return launcher_env(tmp_path, ca, api_server, NAMESPACE)


def launcher(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=timeout)


def start(env: dict[str, str], run_id: str, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher", "submit", "--backend", "kuberay", "--run-id", run_id,
                             *flags, "--", "python train.py"], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def record(env: dict[str, str], run_id: str) -> dict:
    result = launcher(env, "status", run_id, "-o", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def events(env: dict[str, str], run_id: str, kind: str) -> list[dict]:
    """The run's events of one kind (none while the run is not recorded yet)."""
    result = launcher(env, "status", run_id, "-o", "json")
    return [event for event in json.loads(result.stdout)["events"] if event["kind"] == kind] \
        if result.returncode == 0 else []


def job_id(api_server: FakeApiServer, run_id: str) -> str:
    """The running attempt's Ray submission id, once KubeRay gave it one."""
    wait_until(lambda: ((api_server.rayjob(NAMESPACE, run_id) or {}).get("status") or {}).get("jobStatus")
               == "RUNNING", 60, "the RayJob to run")
    return api_server.rayjob(NAMESPACE, run_id)["status"]["jobId"]


def training(submission_id: str, step: int, checkpoint: int) -> str:
    """A sidecar's view of a rank that made `step` (now) and checkpointed at `checkpoint`."""
    labels = f'job_id="02000000",submission_id="{submission_id}",rank="0"'
    return (f"raypulse_train_step{{{labels}}} {step}\n"
            f"raypulse_train_last_progress_time_seconds{{{labels}}} {time.time():.3f}\n"
            f"raypulse_train_checkpoint_step{{{labels}}} {checkpoint}\n")


def xid(at: float) -> str:
    return f'raypulse_gpu_xid_last_timestamp_seconds{{gpu="0",uuid="GPU-0a",xid="79"}} {at:.3f}\n'


def applied_rayjobs(api_server: FakeApiServer) -> list[dict]:
    return [body for method, path, body in api_server.requests
            if method == "POST" and path.endswith("/rayjobs") and isinstance(body, dict)]


def test_a_hang_is_seen_through_the_pod_proxy_and_the_run_resumes_as_attempt_2(
        env: dict[str, str], api_server: FakeApiServer, exporters: dict[str, ExporterLike], tmp_path: Path):
    api_server.scripts["hang-1"] = [Attempt("HOLD", ["step 41"]), Attempt("SUCCEEDED", ["resumed"])]
    process = start(env, "hang-1", "--max-retries", "1", "--retry-backoff", "0", "--active-deadline-seconds", "3600",
                    *HEALTH)
    try:
        exporters["node-a"].text = training(job_id(api_server, "hang-1"), step=42, checkpoint=40)
        assert process.wait(120) == 0, process.stderr.read()
    finally:
        process.kill()
    proxied = [path for method, path, _ in api_server.requests if method == "GET" and "/proxy/" in path]
    assert proxied
    assert all(path.startswith(f"/api/v1/namespaces/{NAMESPACE}/pods/hang-1-raycluster-")
                           for path in proxied)
    run = record(env, "hang-1")
    assert (run["state"], run["exit_code"]) == ("SUCCEEDED", 0)
    assert [(item["attempt"], item["status"]) for item in run["attempts"]] == [(1, "STOPPED"), (2, "SUCCEEDED")]
    fault = next(event for event in run["events"] if event["kind"] == "health.fault")
    assert (fault["details"]["fault"], fault["details"]["action"]) == ("hang", "restart")
    finished = [event["details"]["state"] for event in run["events"] if event["kind"] == "attempt.finished"]
    assert finished == ["UNHEALTHY", "SUCCEEDED"]
    first, second = applied_rayjobs(api_server)
    assert wire.ENV_RESUME_FROM not in first["spec"].get("runtimeEnvYAML", "")
    env_vars = yaml.safe_load(second["spec"]["runtimeEnvYAML"])["env_vars"]
    assert json.loads(env_vars[wire.ENV_RESUME_FROM])["step"] == 40
    assert (first["spec"]["backoffLimit"], second["spec"]["backoffLimit"]) == (1, 0)  # one budget: max_retries 1
    assert first["spec"]["activeDeadlineSeconds"] == 3600
    assert second["spec"]["activeDeadlineSeconds"] < 3600  # what is left of it: KubeRay counts from the RayJob's start
    # Recorded through the same proxy, labelled as the run's PodMonitor labels it: `launcher export` has it.
    exported = launcher(env, "export", "hang-1", "--out", str(tmp_path / "hang-1.om"))
    assert exported.returncode == 0, exported.stderr
    steps = [line for line in (tmp_path / "hang-1.om").read_text().splitlines()
             if line.startswith("raypulse_train_step{")]
    assert steps
    assert all('node="node-a"' in line and f'namespace="{NAMESPACE}"' in line and 'cluster="hang-1-raycluster-' in line
               for line in steps)


@pytest.mark.parametrize("cordon", [True, False])
def test_a_gpu_faults_node_is_cordoned_only_when_asked(env: dict[str, str], api_server: FakeApiServer,
                                                       exporters: dict[str, ExporterLike], cordon: bool):
    api_server.scripts["gpu-1"] = [Attempt("HOLD", ["step 1"]), Attempt("SUCCEEDED", ["again"])]
    flags = ["--cordon-nodes"] if cordon else []
    process = start(env, "gpu-1", "--max-retries", "1", "--retry-backoff", "0", *HEALTH, *flags)
    try:
        job_id(api_server, "gpu-1")
        exporters["node-a"].text = xid(time.time() + 1)  # after the attempt began: its fault
        assert process.wait(120) == 0, process.stderr.read()
    finally:
        process.kill()
    run = record(env, "gpu-1")
    fault = next(event for event in run["events"] if event["kind"] == "health.fault")
    assert (fault["details"]["fault"], fault["details"]["node"]) == ("gpu_fault", "node-a")
    assert fault["details"]["evidence"]["pod"].startswith("gpu-1-raycluster-")
    node = api_server.node("node-a")
    kinds = [event["kind"] for event in run["events"]]
    if cordon:
        assert node["spec"]["unschedulable"] is True
        note = json.loads(node["metadata"]["annotations"][wire.NODE_ANNOTATION_CORDONED])
        assert (note["run_id"], note["fault"]) == ("gpu-1", "gpu_fault")
        assert "node.cordoned" in kinds
        assert "node.left" not in kinds
        assert [pod["spec"]["nodeName"] for pod in api_server.ray_pods(NAMESPACE)] == ["node-b"]  # attempt 2's
    else:
        assert "unschedulable" not in node["spec"]
        assert "node.left" in kinds
        assert "node.cordoned" not in kinds
    assert (run["state"], len(run["attempts"])) == ("SUCCEEDED", 2)


def test_an_exporter_the_proxy_cannot_reach_is_an_event_never_a_restart(tmp_path: Path, ca: trustme.CA):
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens: the API server answers 503
    with FakeApiServer(ca, watch_close_s=0.3, nodes={"node-a": closed}) as api_server:
        env = launcher_env(tmp_path, ca, api_server, NAMESPACE)
        api_server.scripts["dark-1"] = [Attempt("HOLD", ["working"])]
        process = start(env, "dark-1", "--max-retries", "1", *HEALTH)
        try:
            wait_until(lambda: events(env, "dark-1", "health.exporter_unreachable"), 60,
                       "the unreachable exporter's event")
            assert launcher(env, "stop", "dark-1").returncode == 0
            assert process.wait(60) == 3, process.stderr.read()
        finally:
            process.kill()
        run = record(env, "dark-1")
    unreachable = next(event for event in run["events"] if event["kind"] == "health.exporter_unreachable")
    assert unreachable["details"]["node"] == "node-a"
    assert "HTTP 503" in unreachable["details"]["error"]
    assert not [event for event in run["events"] if event["kind"] == "health.fault"]
    assert (run["state"], len(run["attempts"])) == ("STOPPED", 1)
    assert len(applied_rayjobs(api_server)) == 1


def test_a_stop_during_the_restart_leaves_nothing_applied(env: dict[str, str], api_server: FakeApiServer,
                                                          exporters: dict[str, ExporterLike]):
    api_server.scripts["halt-1"] = [Attempt("HOLD", ["step 7"]), Attempt("SUCCEEDED", ["never"])]
    process = start(env, "halt-1", "--max-retries", "1", "--retry-backoff", "600", *HEALTH)
    try:
        exporters["node-a"].text = training(job_id(api_server, "halt-1"), step=7, checkpoint=5)
        wait_until(lambda: record(env, "halt-1")["state"] == "RETRYING", 60, "the restart's backoff")
        assert launcher(env, "stop", "halt-1").returncode == 0
        assert process.wait(60) == 3, process.stderr.read()
    finally:
        process.kill()
    assert api_server.rayjob(NAMESPACE, "halt-1") is None
    assert api_server.ray_pods(NAMESPACE) == []
    assert len(applied_rayjobs(api_server)) == 1  # the next attempt was never applied
    run = record(env, "halt-1")
    assert (run["state"], run["exit_code"], len(run["attempts"])) == ("STOPPED", 3, 1)


def test_a_stop_while_the_restart_waits_for_the_delete_is_seen(env: dict[str, str], api_server: FakeApiServer,
                                                                exporters: dict[str, ExporterLike]):
    """The RayJob deleted to restart it stays while its finalizer runs (here: longer than the test); a stop
    asked meanwhile ends the run STOPPED (exit 3) and finishes its record, the next attempt never applied."""
    api_server.delete_delay_s = 600.0
    api_server.scripts["slowgo-1"] = [Attempt("HOLD", ["step 7"]), Attempt("SUCCEEDED", ["never"])]
    process = start(env, "slowgo-1", "--max-retries", "1", *HEALTH)
    try:
        exporters["node-a"].text = training(job_id(api_server, "slowgo-1"), step=7, checkpoint=5)
        wait_until(lambda: "deletionTimestamp" in (api_server.rayjob(NAMESPACE, "slowgo-1") or {}).get(
            "metadata", {}), 60, "the restart's delete")
        assert launcher(env, "stop", "slowgo-1").returncode == 0
        assert process.wait(60) == 3, process.stderr.read()
    finally:
        process.kill()
    assert len(applied_rayjobs(api_server)) == 1
    run = record(env, "slowgo-1")
    assert (run["state"], run["exit_code"], len(run["attempts"])) == ("STOPPED", 3, 1)


@pytest.mark.parametrize(("answer", "words"), [
    (gzip_bomb(64 * 2**20), "inflates past"),
    (cut_short, "HTTP 503"),  # the API server's proxy turns a broken answer into its own error
])
def test_a_read_through_the_proxy_keeps_the_readers_bounds(tmp_path: Path, ca: trustme.CA, answer, words: str,
                                                           monkeypatch: pytest.MonkeyPatch):
    """The pod proxy reader ends every bad answer as one ReadError (what the watcher reports), with the
    bounded reader's caps."""
    from kubernetes import client

    from launcher.backends.kuberay.access import kube_api
    from launcher.backends.kuberay.proxy import PodProxyReader
    from launcher.health.exporters import ReadError

    with RawServer(answer) as hostile, \
            FakeApiServer(ca, watch_close_s=0.3, nodes={"node-a": hostile.url}) as api_server:
        for key, value in launcher_env(tmp_path, ca, api_server, NAMESPACE).items():
            monkeypatch.setenv(key, value)
        access = kube_api()
        api_server.scripts["bad-1"] = [Attempt("HOLD", ["working"])]
        client.CustomObjectsApi(access.api_client).create_namespaced_custom_object(
            "ray.io", "v1", NAMESPACE, "rayjobs", {"apiVersion": "ray.io/v1", "kind": "RayJob",
                                                  "metadata": {"name": "bad-1"}, "spec": {}})
        wait_until(lambda: api_server.ray_pods(NAMESPACE), 60, "the Ray pod")
        pod = api_server.ray_pods(NAMESPACE)[0]["metadata"]["name"]
        with pytest.raises(ReadError) as error:
            PodProxyReader(access.api_client, NAMESPACE, pod, 8080)(wire.METRICS_PATH, 5.0)
    assert words in str(error.value)
