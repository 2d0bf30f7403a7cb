"""Kubernetes access as kubectl reads it (launcher/backends/kuberay/access.py) and apply
(launcher/backends/kuberay/render.py), through the real kubernetes client against a small API server of
our own (tests/fake_kube.py): the whole KUBECONFIG list merged, the context's namespace, --context, the
pod's service account as the fallback, a dead or refusing server as one line and exit 2, a missing
KubeRay CRD named, and ownerReferences to the RayJob on what apply creates besides it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from launcher.backends.kuberay import access as kubeaccess
from launcher.errors import BadInput
from scripts.ports import free_port
from tests.conftest import REPO
from tests.fake_kube import TOKEN, FakeApiServer, kubeconfig

pytest.importorskip("kubernetes")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def api_server(ca: trustme.CA) -> Iterator[FakeApiServer]:
    with FakeApiServer(ca) as server:
        yield server


def launcher(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("KUBERNETES_")}
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, cwd=REPO,
                          env={**clean, **env}, timeout=60)


def test_a_dead_kubeconfig_server_is_one_line_and_exit_2(tmp_path: Path):
    dead = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    config = kubeconfig(tmp_path / "config", server=dead, ca_file=None, context="dev", current="dev")
    result = launcher("submit", "--backend", "kuberay", "--", "python", "train.py",
                      env={"KUBECONFIG": str(config), "RAYPULSE_HOME": str(tmp_path / "home")})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"{dead} (context dev)" in lines[0]
    assert "kubectl --context dev cluster-info" in lines[0]
    assert "Traceback" not in result.stderr


def test_the_whole_kubeconfig_list_is_merged_as_kubectl_does(tmp_path: Path, ca: trustme.CA,
                                                              api_server: FakeApiServer, monkeypatch):
    """The first file sets current-context to a context only the second defines (kubernetes' own merger
    would take the second file's current-context); the context's namespace is where apply goes."""
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    first = kubeconfig(tmp_path / "first", server=f"https://127.0.0.1:{free_port()}", ca_file=ca_file,
                       context="other", current="team")
    second = kubeconfig(tmp_path / "second", server=api_server.url, ca_file=ca_file, context="team",
                        namespace="team-a", current="other")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "missing"), str(first), str(second)]))
    access = kubeaccess.kube_api()
    assert (access.server, access.namespace, access.context) == (api_server.url, "team-a", "team")
    with pytest.raises(BadInput, match=r"cannot reach the API server https://127.0.0.1:\d+ \(context other\)"):
        kubeaccess.kube_api("other")  # --context picks the first file's context
    with pytest.raises(BadInput, match=r"no context 'nope' .* \(it has: other, team\)"):
        kubeaccess.kube_api("nope")


def test_submit_applies_to_the_contexts_namespace_with_owner_references(tmp_path: Path, ca: trustme.CA,
                                                                        api_server: FakeApiServer):
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    config = kubeconfig(tmp_path / "config", server=api_server.url, ca_file=ca_file, context="team",
                        namespace="team-a")  # no current-context: --context names it
    env = {"KUBECONFIG": str(config), "RAYPULSE_HOME": str(tmp_path / "home")}
    result = launcher("submit", "--backend", "kuberay", "--context", "team", "--run-id", "owned-1", "--no-wait",
                      "--", "python", "train.py", env=env)
    assert result.returncode == 0, result.stderr
    assert "RayJob owned-1 in namespace team-a" in result.stderr
    created = {path: body for method, path, body in api_server.requests if method == "POST"}
    assert set(created) == {"/api/v1/namespaces/team-a/secrets", "/apis/ray.io/v1/namespaces/team-a/rayjobs",
                            "/apis/monitoring.coreos.com/v1/namespaces/team-a/podmonitors"}
    assert all("namespace" not in body["metadata"] for body in created.values())  # the apply namespace wins
    rayjob = api_server.objects["/apis/ray.io/v1/namespaces/team-a/rayjobs/owned-1"]
    owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "owned-1", "uid": rayjob["metadata"]["uid"],
             "blockOwnerDeletion": True}
    secret = api_server.objects["/api/v1/namespaces/team-a/secrets/owned-1-ray-token"]
    assert secret["metadata"]["ownerReferences"] == [owner]
    monitor = api_server.objects["/apis/monitoring.coreos.com/v1/namespaces/team-a/podmonitors/owned-1-raypulse"]
    assert monitor["metadata"]["ownerReferences"] == [owner]
    # The same run id again: the RayJob is found, not repeated, and the Secret keeps its token.
    token = secret["stringData"]["auth_token"]
    posts = len([request for request in api_server.requests if request[0] == "POST"])
    result = launcher("submit", "--backend", "kuberay", "--context", "team", "--run-id", "owned-1", "--no-wait",
                      "--", "python", "train.py", env=env)
    assert result.returncode == 0, result.stderr
    assert ("GET", "/apis/ray.io/v1/namespaces/team-a/rayjobs/owned-1", None) in api_server.requests
    assert len([request for request in api_server.requests if request[0] == "POST"]) == posts + 3  # all 409
    assert secret["stringData"]["auth_token"] == token


def test_a_missing_kuberay_crd_is_named(tmp_path: Path, ca: trustme.CA, api_server: FakeApiServer):
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    config = kubeconfig(tmp_path / "config", server=api_server.url, ca_file=ca_file, context="team", current="team")
    api_server.crd_installed = False
    result = launcher("submit", "--backend", "kuberay", "--", "python", "train.py",
                      env={"KUBECONFIG": str(config), "RAYPULSE_HOME": str(tmp_path / "home")})
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "no RayJob resource (ray.io/v1): the KubeRay CRDs are not installed" in result.stderr
    assert "Traceback" not in result.stderr


def test_refused_credentials_are_one_line(tmp_path: Path, ca: trustme.CA, api_server: FakeApiServer):
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    config = kubeconfig(tmp_path / "config", server=api_server.url, ca_file=ca_file, context="team",
                        current="team", token="expired")
    result = launcher("submit", "--backend", "kuberay", "--", "python", "train.py",
                      env={"KUBECONFIG": str(config), "RAYPULSE_HOME": str(tmp_path / "home")})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"launcher: kubernetes: the API server {api_server.url} (context team) refused the credentials (401 "
        "Unauthorized); log in again (`kubectl --context team get ns` runs your login plugin) or pick another "
        "context with --context"]


def test_in_a_pod_the_service_account_is_the_fallback(tmp_path: Path, ca: trustme.CA, api_server: FakeApiServer,
                                                      monkeypatch):
    """No kubeconfig anywhere, KUBERNETES_SERVICE_HOST/PORT set, the service account's files in a
    directory of our own: the client talks to that host with that token, in that namespace."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN)
    ca.cert_pem.write_to_path(str(account / "ca.crt"))
    (account / "namespace").write_text("ci-jobs\n")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api_server.port))
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    access = kubeaccess.kube_api(service_account_dir=account)
    assert (access.server, access.namespace, access.context) == (api_server.url, "ci-jobs", None)
    assert [request[:2] for request in api_server.requests] == [("GET", "/version/")]  # with the token: no 401
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(BadInput, match=r"no kubeconfig at .* and not in a pod"):
        kubeaccess.kube_api(service_account_dir=account)


def test_crd_missing_tells_a_missing_resource_from_a_missing_object():
    from kubernetes.client.rest import ApiException

    def exception(status: int, body: str) -> ApiException:
        error = ApiException(status=status, reason="Not Found")
        error.body = body
        return error

    assert kubeaccess.rayjob_crd_missing(exception(404, "404 page not found"))
    named = json.dumps({"kind": "Status", "reason": "NotFound", "details": {"kind": "rayjobs", "name": "x"}})
    assert not kubeaccess.rayjob_crd_missing(exception(404, named))
    assert not kubeaccess.rayjob_crd_missing(exception(403, "forbidden"))
