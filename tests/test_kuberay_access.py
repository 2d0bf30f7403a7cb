"""Kubernetes access as kubectl reads it (launcher/kubeaccess.py) and apply (launcher/kuberay.py), through
the real kubernetes client against a small API server of our own (aiohttp, TLS from trustme) that answers
the few calls apply makes: the whole KUBECONFIG list merged, the context's namespace, --context, the
pod's service account as the fallback, a dead or refusing server as one line and exit 2, a missing
KubeRay CRD named, and ownerReferences to the RayJob on what apply creates besides it."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from aiohttp import web

from launcher import kubeaccess
from launcher.errors import BadInput
from scripts.ports import free_port
from tests.conftest import REPO

pytest.importorskip("kubernetes")

TOKEN = "fake-service-account-token"


class FakeApiServer:
    """The API server calls apply makes, over HTTPS with a bearer token; every request is recorded."""

    def __init__(self, ca: trustme.CA, token: str = TOKEN) -> None:
        self.token = token
        self.crd_installed = True
        self.requests: list[tuple[str, str, Any]] = []
        self.objects: dict[str, dict[str, Any]] = {}  # path of the object -> object
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(self._ssl)
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        assert self._started.wait(10), "the fake API server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=self._ssl).start())
        self._started.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    @staticmethod
    def _status(code: int, reason: str, message: str, kind: str | None = None, name: str | None = None) -> web.Response:
        details = {"kind": kind, "name": name} if kind else {}
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                                  "reason": reason, "details": details, "code": code}, status=code)

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        path = request.path
        self.requests.append((request.method, path, body))
        if request.headers.get("Authorization", "").removeprefix("Bearer ").removeprefix("bearer ") != self.token:
            return self._status(401, "Unauthorized", "Unauthorized")
        if path.rstrip("/") == "/version":
            return web.json_response({"major": "1", "minor": "33", "gitVersion": "v1.33.0"})
        parts = path.strip("/").split("/")  # api/v1/namespaces/NS/secrets[/NAME], apis/G/V/namespaces/NS/R[/NAME]
        group = parts[:2] if parts[0] == "api" else parts[:3]
        rest = parts[len(group):]
        if group[:2] == ["apis", "ray.io"] and not self.crd_installed:
            return web.Response(status=404, text="404 page not found")
        if len(rest) < 3 or rest[0] != "namespaces":
            return self._status(404, "NotFound", "not here")
        resource = rest[2]
        if request.method == "POST" and len(rest) == 3:
            key = f"{path}/{body['metadata']['name']}"
            if key in self.objects:
                return self._status(409, "AlreadyExists", "already exists", resource, body["metadata"]["name"])
            stored = {**body, "metadata": {**body["metadata"], "namespace": rest[1], "uid": str(uuid.uuid4())}}
            self.objects[key] = stored
            return web.json_response(stored, status=201)
        if len(rest) == 4 and path in self.objects:
            if request.method == "GET":
                return web.json_response(self.objects[path])
            if request.method == "PATCH" and request.content_type == "application/merge-patch+json":
                stored = self.objects[path]
                stored["metadata"].update(body["metadata"])
                return web.json_response(stored)
        return self._status(404, "NotFound", f"{resource} not found", resource, rest[3] if len(rest) > 3 else None)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def api_server(ca: trustme.CA) -> Iterator[FakeApiServer]:
    with FakeApiServer(ca) as server:
        yield server


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
