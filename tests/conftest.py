"""Shared fixtures: real exporter processes, a real Prometheus, and HTTP helpers."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts.ports import free_port
from tests.launcher_support import SharedCluster

REPO = Path(__file__).resolve().parent.parent
SHARED_CLUSTER = "shared_cluster"  # the fixture below
HEAD_STARTS = pytest.StashKey[dict[str, tuple[str, ...]]]()


def pytest_configure(config: pytest.Config) -> None:
    """The session gets a HOME of its own, so no test reads the user's ~/.ray/auth_token (a `ray.init()`
    run by hand writes one; every exporter a test starts would then ask for tokens, and get 401s)."""
    home = Path(tempfile.mkdtemp(prefix="raypulse-test-home-"))
    config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
    os.environ["HOME"] = str(home)


def http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 5.0,
             context=None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class RunningExporter:
    process: subprocess.Popen
    url: str
    log: Path

    def get(self, path: str = "/metrics", **kwargs) -> tuple[int, dict[str, str], bytes]:
        return http_get(self.url + path, **kwargs)

    def metrics_text(self) -> str:
        status, _, body = self.get("/metrics")
        assert status == 200
        return body.decode()


def exporter_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "exporter", *args]


@pytest.fixture
def start_exporter(tmp_path: Path) -> Iterator[Callable[..., RunningExporter]]:
    """Start `exporter serve` as a real process; waits until /readyz says ready."""
    started: list[subprocess.Popen] = []

    def start(*args: str, env: dict[str, str] | None = None, ready: bool = True,
              scheme: str = "http", port: int | None = None, nofile: int | None = None) -> RunningExporter:
        """`nofile`: the exporter's soft limit on open files (RLIMIT_NOFILE)."""
        port = port or free_port()
        log = tmp_path / f"exporter-{port}.log"

        def limit() -> None:
            if nofile is not None:
                _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

        process = subprocess.Popen(exporter_command("serve", "--listen", f"127.0.0.1:{port}", *args),
                                   stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO,
                                   env={**os.environ, **(env or {})}, preexec_fn=limit)
        started.append(process)
        running = RunningExporter(process, f"{scheme}://127.0.0.1:{port}", log)
        if ready:
            wait_until(lambda: process.poll() is not None or running.get("/readyz")[0] == 200, 30,
                       "the exporter to become ready")
            assert process.poll() is None, log.read_text()
        return running

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture(scope="module")
def node_exporter_module(tmp_path_factory) -> Iterator[RunningExporter]:
    """One exporter with the default collectors, shared by a module's read-only tests."""
    port = free_port()
    log = tmp_path_factory.mktemp("exporter") / "exporter.log"
    process = subprocess.Popen(exporter_command("serve", "--listen", f"127.0.0.1:{port}"),
                               stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO)
    running = RunningExporter(process, f"http://127.0.0.1:{port}", log)
    wait_until(lambda: running.get("/readyz")[0] == 200, 30, "the exporter to become ready")
    # Every collector has run once; wait for the rendering that includes the last of them.
    wait_until(lambda: "raypulse_exporter_collector_last_success_timestamp_seconds{collector=\"host\"}"
               in running.metrics_text(), 10, "a rendering with every collector")
    yield running
    process.terminate()
    process.wait(10)


def binary(name: str) -> str:
    path = shutil.which(name) or f"/usr/bin/{name}"
    if not Path(path).exists():
        pytest.fail(f"{name} is not installed; run .ci/run or `apt-get install -y prometheus "
                    f"prometheus-alertmanager prometheus-node-exporter`")
    return path


@dataclass
class RunningPrometheus:
    process: subprocess.Popen
    url: str

    def api(self, path: str) -> dict:
        import json

        status, _, body = http_get(self.url + path)
        assert status == 200, body
        return json.loads(body)

    def query(self, promql: str) -> list[dict]:
        from urllib.parse import quote

        return self.api(f"/api/v1/query?query={quote(promql)}")["data"]["result"]


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[Callable[[str], RunningPrometheus]]:
    """Start the real Prometheus binary with the given config YAML."""
    started: list[subprocess.Popen] = []

    def start(config_yaml: str) -> RunningPrometheus:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(config_yaml)
        process = subprocess.Popen(
            [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=(tmp_path / "prometheus.log").open("wb"), stderr=subprocess.STDOUT)
        started.append(process)
        running = RunningPrometheus(process, f"http://127.0.0.1:{port}")
        wait_until(lambda: http_get(running.url + "/-/ready")[0] == 200, 60, "Prometheus to become ready")
        return running

    yield start
    for process in started:
        process.terminate()
        process.wait(20)


@pytest.fixture(scope="session")
def shared_launcher_home(tmp_path_factory) -> Path:
    """The RAYPULSE_HOME of the modules whose tests use the shared cluster (all their tests: one home)."""
    return tmp_path_factory.mktemp("raypulse-shared-home")


@pytest.fixture(scope="session")
def shared_cluster(request: pytest.FixtureRequest, shared_launcher_home: Path) -> Iterator[SharedCluster]:
    """The kept local cluster that tests of several modules submit their runs into (a Ray cluster starts
    once for all of them, not once per module): `shared_cluster.record()`."""
    shared = SharedCluster(shared_launcher_home, request.config.stash.get(HEAD_STARTS, {}))
    yield shared
    shared.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the shared cluster run one after another, where the first of them was; those that take
    a head-start run last, so the others run while it goes."""
    users = [item for item in items if SHARED_CLUSTER in getattr(item, "fixturenames", ())]
    if users:
        first, chosen = items.index(users[0]), {id(item) for item in users}
        others = [item for item in items if id(item) not in chosen]
        users.sort(key=lambda item: bool(_head_starts(item)))  # stable: each part keeps its order
        items[:] = others[:first] + users + others[first:]


def _head_starts(item: pytest.Item) -> dict[str, tuple[str, ...]]:
    return getattr(getattr(item, "module", None), "HEAD_START", {})


def pytest_collection_finish(session: pytest.Session) -> None:
    """The head-start runs of the tests selected (launcher_support.SharedCluster), for the shared cluster."""
    session.config.stash[HEAD_STARTS] = {run_id: tuple(args) for item in session.items
                                         for run_id, args in _head_starts(item).items()}


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The shared cluster goes right after the last test on it: the tests after run without it beside them."""
    shared = getattr(item, "funcargs", {}).get(SHARED_CLUSTER)  # absent when the test's setup failed before it
    if shared is not None and SHARED_CLUSTER not in getattr(nextitem, "fixturenames", ()):
        shared.close()
