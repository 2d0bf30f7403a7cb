"""`launcher logs RUN --all-nodes` on KubeRay: every Ray pod's log (head, workers) and the submitter's saved
under the run's directory as `kubectl ray log` gathers them, within one byte budget for all pods together
(what was cut is said), and clear errors where there is nothing to gather.

Against our fake API server (tests/fake_kube.py: KubeRay's labels on the Ray pods, the log subresource with
container, tailLines and limitBytes) through the real kubernetes client and the real CLI.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.conftest import wait_until
from tests.fake_kube import Attempt, FakeApiServer, launcher, launcher_env

pytest.importorskip("kubernetes")

NAMESPACE = "team-a"
NOWHERE = "http://127.0.0.1:9"  # the Ray pods' sidecars are not read here


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def api_server(ca: trustme.CA) -> Iterator[FakeApiServer]:
    with FakeApiServer(ca, watch_close_s=0.3, nodes={"node-a": NOWHERE}, workers=2) as server:
        yield server


@pytest.fixture
def env(tmp_path: Path, ca: trustme.CA, api_server: FakeApiServer) -> dict[str, str]:
    return launcher_env(tmp_path, ca, api_server, NAMESPACE)



def running(env: dict[str, str], api_server: FakeApiServer, run_id: str) -> None:
    """A run left to KubeRay (--no-wait) whose attempt runs, with its Ray pods and submitter pod."""
    api_server.scripts[run_id] = [Attempt("HOLD", ["step 1", "step 2"])]
    result = launcher(env, "submit", "--backend", "kuberay", "--run-id", run_id, "--no-wait", "--", "python train.py")
    assert result.returncode == 0, result.stderr
    wait_until(lambda: ((api_server.rayjob(NAMESPACE, run_id) or {}).get("status") or {}).get("jobStatus")
               == "RUNNING", 60, "the RayJob to run")


def test_all_nodes_saves_every_ray_pods_log_and_the_submitters(env: dict[str, str], api_server: FakeApiServer):
    running(env, api_server, "logs-1")
    result = launcher(env, "logs", "logs-1", "--all-nodes", "-o", "json")
    assert result.returncode == 0, result.stderr
    saved = json.loads(result.stdout)
    cluster = api_server.rayjob(NAMESPACE, "logs-1")["status"]["rayClusterName"]
    head, workers = f"{cluster}-head", [f"{cluster}-worker-0", f"{cluster}-worker-1"]
    submitter = next(name for name in saved["pods"] if "-raycluster-" not in name)  # the Job's pod: logs-1-xxxxxx
    assert saved["pods"] == [head, submitter, *workers]  # the head first, as kubectl-ray's `--node-type head`
    assert (saved["cut"], saved["errors"]) == ([], [])
    directory = Path(saved["directory"])
    assert directory.parent.parent.name == "logs-1"  # under the run's directory
    # Each pod's first container, the Ray container (not the sidecar), as `<pod>/stdout.log`.
    assert (directory / head / "stdout.log").read_text() == f"{head} ray-head: Ray runtime started\n"
    assert (directory / workers[1] / "stdout.log").read_text() == f"{workers[1]} ray-worker: Ray runtime started\n"
    wait_until(lambda: "step 2" in launcher(env, "logs", "logs-1").stdout, 60, "the driver's second step")
    again = json.loads(launcher(env, "logs", "logs-1", "--all-nodes", "-o", "json").stdout)
    assert (Path(again["directory"]) / submitter / "stdout.log").read_text() == "step 1\nstep 2\n"
    assert json.loads((directory / "summary.json").read_text())["pods"] == saved["pods"]
    text = launcher(env, "logs", "logs-1", "--all-nodes")
    assert text.returncode == 0
    assert "4 pod log(s)" in text.stdout
    assert "saved in" in text.stdout


def test_the_budget_is_for_all_pods_together_and_the_cut_is_said(env: dict[str, str], api_server: FakeApiServer,
                                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import time

    from kubernetes import client

    from launcher.backends.kuberay.access import kube_api
    from launcher.backends.kuberay.podlogs import gather, ray_pods

    running(env, api_server, "big-1")
    cluster = api_server.rayjob(NAMESPACE, "big-1")["status"]["rayClusterName"]
    for index in range(2000):  # the head's log is long; the workers' stay short
        api_server.append_log(NAMESPACE, f"{cluster}-head", f"line {index:05d}\n")
    wait_until(lambda: "line 01999" in client_log(env, monkeypatch, f"{cluster}-head", container="ray-head"), 30,
               "the head's long log")
    for key in ("KUBECONFIG", "RAYPULSE_HOME"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    access = kube_api()
    core = client.CoreV1Api(access.api_client)
    pods = ray_pods(core, NAMESPACE, "big-1", cluster)
    gathered = gather(core, NAMESPACE, pods, tmp_path / "out", cap_bytes=4000, deadline=time.monotonic() + 60)
    files = sorted((tmp_path / "out").glob("*/stdout.log"))
    assert len(files) == len(pods) == 4
    assert sum(path.stat().st_size for path in files) == gathered.written <= 4000
    assert gathered.cut == [f"{cluster}-head"]
    assert "cut to the budget of 4,000 bytes for all pods together" in gathered.summary
    head = (tmp_path / "out" / f"{cluster}-head" / "stdout.log").read_text()
    assert head.endswith("line 01999\n")  # its end is kept
    worker = (tmp_path / "out" / f"{cluster}-worker-1" / "stdout.log").read_text()
    assert worker == f"{cluster}-worker-1 ray-worker: Ray runtime started\n"  # whole: it fitted


def client_log(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, pod: str, **options: object) -> str:
    from kubernetes import client

    from launcher.backends.kuberay.access import kube_api

    for key in ("KUBECONFIG", "RAYPULSE_HOME"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    core = client.CoreV1Api(kube_api().api_client)
    return core.read_namespaced_pod_log(pod, NAMESPACE, **options)


def test_the_fakes_log_subresource_reads_as_the_apis(env: dict[str, str], api_server: FakeApiServer,
                                                    monkeypatch: pytest.MonkeyPatch):
    from kubernetes.client.rest import ApiException

    running(env, api_server, "api-1")
    head = api_server.rayjob(NAMESPACE, "api-1")["status"]["rayClusterName"] + "-head"
    for index in range(3):
        api_server.append_log(NAMESPACE, head, f"more {index}\n")
    wait_until(lambda: "more 2" in client_log(env, monkeypatch, head, container="ray-head"), 30, "the head's lines")
    with pytest.raises(ApiException) as refused:  # two containers: which one must be said
        client_log(env, monkeypatch, head)
    assert refused.value.status == 400
    assert "a container name must be specified" in json.loads(refused.value.body)["message"]
    with pytest.raises(ApiException) as unknown:
        client_log(env, monkeypatch, head, container="nope")
    assert unknown.value.status == 400
    assert client_log(env, monkeypatch, head, container="raypulse-exporter") == f"{head} raypulse-exporter: serving\n"
    assert client_log(env, monkeypatch, head, container="ray-head", tail_lines=2) == "more 1\nmore 2\n"
    assert client_log(env, monkeypatch, head, container="ray-head", tail_lines=2, limit_bytes=8) == "more 1\nm"


def test_bad_input_is_a_clear_error_and_exit_2(env: dict[str, str], api_server: FakeApiServer):
    unknown = launcher(env, "logs", "nope-1", "--all-nodes")
    assert unknown.returncode == 2
    assert "no run 'nope-1'" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    running(env, api_server, "bad-1")
    for flags, named in ((["--follow"], "--follow"), (["--attempt", "1"], "--attempt")):
        clash = launcher(env, "logs", "bad-1", "--all-nodes", *flags)
        assert clash.returncode == 2
        assert f"drop {named}" in clash.stderr
    assert launcher(env, "stop", "bad-1").returncode == 0
    wait_until(lambda: api_server.rayjob(NAMESPACE, "bad-1") is None, 60, "the RayJob to go")
    gone = launcher(env, "logs", "bad-1", "--all-nodes")
    assert gone.returncode == 2
    assert "the RayJob bad-1 is gone" in gone.stderr
    assert "Traceback" not in gone.stderr
