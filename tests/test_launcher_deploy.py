"""`launcher exporters deploy|status|remove` and `launcher prometheus-config` on a Ray cluster
started by hand (plain `ray start`, token auth on, no raypulse node labels, no PYTHONPATH: the
exporter reaches the nodes only through Ray's runtime env). All nodes share this host, so their
exporters take distinct ports. The tests run in order on one module-scoped cluster.

Run under `flock /tmp/raypulse-ray.lock` (other Ray tests start clusters too)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from exporter.contract import wire
from exporter.gpusim import control
from launcher.deploy.raypulse_agent.node import NodeExporter
from tests.conftest import http_get, wait_until
from tests.launcher_support import free_port_range, launcher, start_launcher, status_json
from tests.ray_testcluster import RAY, RayCluster, RayNode, start_prometheus, stop_process

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]
INTERVAL = 2.0  # the supervisor's round, seconds
NODE_PORTS = 48  # Ray's ports per node: 7 fixed ones and 41 for its workers


class PlainCluster(RayCluster):
    """Nodes as someone else would start them: no raypulse labels, no repo on PYTHONPATH."""

    node_ports = 0  # first port of the nodes' ranges (NODE_PORTS each), set by the fixture

    def env(self, node: RayNode | None = None) -> dict[str, str]:
        env = super().env()
        env.pop("PYTHONPATH", None)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # `python` of the job driver
        if node is not None and not node.head:  # each worker's simulated GPU takes faults from its own file
            env[wire.ENV_GPU_CONTROL_FILE] = str(self.gpu_control(self.nodes.index(node)))
        return env

    def gpu_control(self, index: int) -> Path:
        return self.temp_dir / f"gpus-{index}.json"

    def start_node(self, node: RayNode) -> None:
        # Not from the checkout: Ray workers would find the repo's packages through their cwd.
        result = subprocess.run([RAY, "start", *node.args], env=self.env(node), capture_output=True, text=True,
                                timeout=120, cwd=self.temp_dir)
        assert result.returncode == 0, f"ray start {' '.join(node.args)} failed:\n{result.stdout}\n{result.stderr}"

    def add_node(self, *, head: bool, num_cpus: int, exporter_port: int | None = None) -> RayNode:
        node = RayNode(0, 0, head)
        # Every port of the node from the module's free range below the ephemeral ports: a port
        # picked by binding to 0 can be handed to some client socket before Ray binds it.
        base = self.node_ports + NODE_PORTS * len(self.nodes)
        node.args = ["--num-cpus", str(num_cpus), "--object-store-memory", str(80 * 1024 * 1024),
                     "--disable-usage-stats", "--node-ip-address", "127.0.0.1",
                     "--node-manager-port", str(base), "--object-manager-port", str(base + 1),
                     "--runtime-env-agent-port", str(base + 2), "--dashboard-agent-grpc-port", str(base + 3),
                     "--dashboard-agent-listen-port", str(base + 4), "--metrics-export-port", str(base + 5),
                     "--min-worker-port", str(base + 7), "--max-worker-port", str(base + 47)]
        if head:
            node.args = ["--head", "--temp-dir", str(self.temp_dir), "--port", str(self.gcs_port),
                         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port),
                         "--include-dashboard", "true", "--ray-client-server-port", str(base + 6), *node.args]
        else:  # a resource to find the node by, and one the test's job asks for (workers only)
            resources = json.dumps({f"node{len(self.nodes)}": 1, "worker": 1})
            node.args = ["--address", f"127.0.0.1:{self.gcs_port}", "--resources", resources, *node.args]
        self.nodes.append(node)
        self.start_node(node)
        return node


class Deployment:
    def __init__(self, cluster: PlainCluster, home: Path, token_path: Path, base_port: int) -> None:
        self.cluster, self.home, self.token_path, self.base_port = cluster, home, token_path, base_port

    def launcher(self, *args: str, timeout: float = 300):
        return launcher(*args, "--address", self.cluster.dashboard_url, "--token-path", str(self.token_path),
                        home=self.home, timeout=timeout)

    def deploy(self, *extra: str):
        return self.launcher("exporters", "deploy", "--port", str(self.base_port), "--interval", str(INTERVAL),
                             "--cluster", "handmade", "--simulate-gpus", "1", *extra)

    def status(self) -> dict[str, Any]:
        result = self.launcher("exporters", "status", "-o", "json")
        return json.loads(result.stdout)

    def alive_node_ids(self) -> set[str]:
        nodes = self.cluster.api("/api/v0/nodes?limit=100")["data"]["result"]["result"]
        return {n["node_id"] for n in nodes if n["state"] == "ALIVE"}

    def raypulse_actors(self) -> list[dict[str, Any]]:
        path = ("/api/v0/actors?limit=1000&filter_keys=ray_namespace&filter_predicates=%3D&filter_values="
                + wire.DEPLOY_NAMESPACE)
        return [a for a in self.cluster.api(path)["data"]["result"]["result"] if a["state"] != "DEAD"]

    def sd(self) -> list[dict[str, Any]]:
        head = next(row for row in self.status()["nodes"] if row["role"] == "head")
        status, _, body = http_get(head["exporter_url"] + "/sd")
        assert status == 200, body
        return json.loads(body)

    def all_up(self, nodes: int) -> bool:
        report = self.status()
        return len(report["nodes"]) == nodes and report["complete"]


def listen_port(cmdline: list[str]) -> int | None:
    if "exporter" in cmdline and "serve" in cmdline and "--listen" in cmdline:
        return int(cmdline[cmdline.index("--listen") + 1].rpartition(":")[2])
    return None


def exporter_processes(base_port: int, port: int | None = None) -> list[psutil.Process]:
    """Exporter processes listening in this test's port range (not other tests' exporters)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        listen = listen_port(process.info["cmdline"] or [])
        if listen is not None and base_port <= listen < base_port + 40 and port in (None, listen):
            found.append(process)
    return found


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Iterator[Deployment]:
    temp = Path(tempfile.mkdtemp(prefix="rpd-"))  # short: Ray's socket paths live under it
    # One free range for everything of the module: the exporters (base..base+39), the head's GCS and
    # dashboard, then up to 5 nodes' Ray ports; separate picks could overlap before Ray binds them.
    base = free_port_range(50 + 5 * NODE_PORTS)
    cluster = PlainCluster(temp_dir=temp, token=os.urandom(16).hex(), gcs_port=base + 40, dashboard_port=base + 41)
    cluster.node_ports = base + 50
    home = tmp_path_factory.mktemp("home")
    token_path = home / "token"
    token_path.write_text(cluster.token)
    try:
        cluster.add_node(head=True, num_cpus=1)
        cluster.add_node(head=False, num_cpus=1)
        cluster.add_node(head=False, num_cpus=1)
        cluster.wait_ready(3)
        yield Deployment(cluster, home, token_path, base)
    finally:
        cluster.kill()
        shutil.rmtree(temp, ignore_errors=True)
        for leftover in Path(tempfile.gettempdir()).glob("raypulse-exporter-*-*-*"):  # node actors' private dirs
            port = leftover.name.split("-")[3]
            if port.isdigit() and base <= int(port) < base + 40 and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
        for process in exporter_processes(base):  # what the actors' death did not take with it
            process.kill()


def test_a_node_actor_starts_restarts_and_stops_its_exporter(tmp_path: Path):
    # The actor's class without Ray: what runs on each node.
    port = free_port_range(2)
    node = NodeExporter("ab" * 28, "127.0.0.1", port, "worker",
                        {"dashboard_url": "http://127.0.0.1:1", "cluster": "unit", "start_timeout_s": 30})
    try:
        first = node.ensure()
        assert first["ok"], first
        assert (first["url"], first["starts"]) == (f"http://127.0.0.1:{port}", 1)
        assert node.ensure()["pid"] == first["pid"]  # running: left alone
        psutil.Process(first["pid"]).kill()
        psutil.Process(first["pid"]).wait(10)
        second = node.ensure()
        assert second["ok"], second
        assert second["pid"] != first["pid"]
        assert second["starts"] == 2
    finally:
        node.stop()
    assert not psutil.pid_exists(second["pid"]) or psutil.Process(second["pid"]).status() == psutil.STATUS_ZOMBIE
    assert not node.log.exists()

    with socket.socket() as blocker:  # the port is taken: a failure with the exporter's own words
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        taken = NodeExporter("ab" * 28, "127.0.0.1", port, "worker",
                             {"dashboard_url": "http://127.0.0.1:1", "cluster": "unit", "start_timeout_s": 30})
        try:
            report = taken.ensure()
        finally:
            taken.stop()
    assert not report["ok"]
    assert "exited with code" in report["error"]
    assert "address already in use" in report["stderr_tail"].lower()


def test_deploy_places_one_exporter_per_node(deployment: Deployment):
    result = deployment.deploy("-o", "json")
    assert result.returncode == 0, result.stderr + result.stdout
    placed = json.loads(result.stdout)
    assert {node["node_id"] for node in placed["nodes"]} == deployment.alive_node_ids()
    assert all(node["ok"] and node["placed_now"] for node in placed["nodes"])
    assert sorted(node["role"] for node in placed["nodes"]) == ["head", "worker", "worker"]
    # Nodes share this host: each takes its own pair of ports.
    assert sorted(node["port"] for node in placed["nodes"]) == [deployment.base_port + k for k in (0, 2, 4)]
    # The exporter came through the runtime env (py_modules), not from this checkout.
    for node in placed["nodes"]:
        assert "runtime_resources" in node["exporter_module"], node["exporter_module"]

    text = deployment.launcher("exporters", "status")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("supervisor: running\nNODE ID")
    assert sum(" yes " in line for line in text.stdout.splitlines()) == 3
    report = deployment.status()
    assert report["supervisor"]
    assert report["complete"]
    for row in report["nodes"]:
        assert row["up"]
        assert row["version"]
        status, _, body = http_get(row["exporter_url"] + "/metrics")
        assert status == 200
        assert b"raypulse_exporter_build_info" in body
    # The head exporter's /sd lists all three, at the ports the actors are named with.
    urls = {row["exporter_url"].removeprefix("http://") for row in report["nodes"]}
    wait_until(lambda: {t for g in deployment.sd() for t in g["targets"]} == urls, 60, "/sd to list 3 exporters")
    assert {g["labels"]["cluster"] for g in deployment.sd()} == {"handmade"}
    assert len(exporter_processes(deployment.base_port)) == 3

    # A second deploy changes nothing: same actors, same exporter processes.
    pids = {node["node_id"]: node["pid"] for node in placed["nodes"]}
    again = deployment.deploy("-o", "json")
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["supervisor_existed"]
    assert not any(node["placed_now"] for node in second["nodes"])
    assert {node["node_id"]: node["pid"] for node in second["nodes"]} == pids
    assert len(deployment.raypulse_actors()) == 4  # supervisor + one per node
    # Other settings are refused rather than half-applied.
    other = deployment.launcher("exporters", "deploy", "--port", str(deployment.base_port + 20))
    assert other.returncode == 2
    assert "already deployed with other settings" in other.stderr


def test_a_node_that_joins_gets_an_exporter(deployment: Deployment):
    deployment.cluster.add_node(head=False, num_cpus=1)
    deployment.cluster.wait_ready(4)
    # Within the supervisor's round (plus worker and runtime env start-up on the new node).
    wait_until(lambda: deployment.all_up(4), 90, "the fourth node's exporter", interval=1)
    urls = {row["exporter_url"].removeprefix("http://") for row in deployment.status()["nodes"]}
    wait_until(lambda: {t for g in deployment.sd() for t in g["targets"]} == urls, 60, "/sd to list 4 exporters")


def test_an_exporter_that_dies_is_replaced(deployment: Deployment):
    worker = next(row for row in deployment.status()["nodes"] if row["role"] == "worker")
    port = int(worker["exporter_url"].rpartition(":")[2])
    [victim] = exporter_processes(deployment.base_port, port)
    victim.kill()
    victim.wait(10)

    def replaced() -> bool:
        again = [p for p in exporter_processes(deployment.base_port, port) if p.pid != victim.pid]
        return bool(again) and http_get(worker["exporter_url"] + "/healthz")[0] == 200

    wait_until(replaced, 60, "a new exporter on the same port", interval=0.5)
    assert len(exporter_processes(deployment.base_port)) == 4

    # The actor's own worker dies: its exporter goes with it, and the supervisor places a new actor.
    [exporter] = exporter_processes(deployment.base_port, port)
    actor_worker = exporter.parent()
    actor_worker.kill()
    exporter.wait(15)

    def placed_again() -> bool:
        again = exporter_processes(deployment.base_port, port)
        return bool(again) and again[0].parent().pid != actor_worker.pid and deployment.all_up(4)

    wait_until(placed_again, 90, "a new actor and exporter on the node", interval=1)
    assert len(exporter_processes(deployment.base_port)) == 4
    assert len(deployment.raypulse_actors()) == 5


def test_prometheus_discovers_and_scrapes_every_node(deployment: Deployment, tmp_path: Path):
    result = deployment.launcher("prometheus-config", "--scrape-interval", "1s", "--sd-refresh-interval", "1s")
    assert result.returncode == 0, result.stderr
    assert "http_sd_configs" in result.stdout
    process, prometheus = start_prometheus(tmp_path, result.stdout)
    try:
        def all_up() -> bool:
            up = prometheus.query('up{job="raypulse"}')
            return len(up) == 4 and all(r["value"][1] == "1" for r in up)

        wait_until(all_up, 90, "Prometheus to scrape 4 exporters", interval=1)
        nodes = {r["metric"]["ray_node_id"] for r in prometheus.query('up{job="raypulse"}')}
        assert nodes == deployment.alive_node_ids()
        # Every node's Ray metrics agent too, through the head exporter's /sd/ray (job "ray").
        wait_until(lambda: len(prometheus.query(f'up{{job="{wire.RAY_METRICS_JOB}"}} == 1')) >= len(nodes), 90,
                   "Prometheus to scrape every node's Ray metrics agent", interval=1)
        rules = prometheus.api("/api/v1/rules")["data"]["groups"]
        assert len(rules) >= 5  # alerts/rules/*.yaml loaded from their absolute paths
    finally:
        stop_process(process)


# One actor on a worker: it says where it runs, then steps: attempt 1 until the watcher stops it (the
# fault is injected once it has said where), attempt 2 only briefly (where it runs is what counts).
ON_A_WORKER = ("python -c 'import os, time, ray\nray.init()\n"
               "@ray.remote(num_cpus=1, resources={\"worker\": 1})\nclass Trainer:\n"
               "    def run(self):\n        print(\"node\", ray.get_runtime_context().get_node_id(), flush=True)\n"
               "        time.sleep(200 if os.environ[\"RAYPULSE_ATTEMPT\"] == \"1\" else 2)\n\n"
               "ray.get(Trainer.remote().run.remote())'")


def test_a_gpu_fault_drains_its_node_and_the_run_goes_on_elsewhere(deployment: Deployment):
    """The launcher's watcher on an existing cluster: it reads the deployed exporters through the head
    exporter's /sd, and keeps the faulty node out of the next attempt through Ray's drain API."""
    process = start_launcher("submit", "--address", deployment.cluster.dashboard_url, "--token-path",
                             str(deployment.token_path), "--run-id", "drain-1", "--health-check-interval", "1",
                             "--max-retries", "1", "--retry-backoff", "1", "--", ON_A_WORKER, home=deployment.home)

    def placed(attempt: int) -> str | None:
        log = deployment.launcher("logs", "drain-1", "--attempt", str(attempt))
        found = re.search(r"node ([0-9a-f]{56})", log.stdout) if log.returncode == 0 else None
        return found.group(1) if found else None

    wait_until(lambda: placed(1) is not None, 120, "attempt 1's actor")
    faulty = placed(1)
    nodes = deployment.cluster.api("/api/v0/nodes?detail=1&limit=100")["data"]["result"]["result"]
    index = next(int(name[4:]) for node in nodes if node["node_id"] == faulty
                 for name in node["resources_total"] if re.fullmatch(r"node\d+", name))
    control.update(deployment.cluster.gpu_control(index),
                   lambda document: control.gpu_entry(document, 0).events.append(control.Event(seq=1, type="xid",
                                                                                               data=79)))
    assert process.wait(240) == 0, process.stderr.read()
    record = status_json("drain-1", deployment.home)
    assert [attempt["status"] for attempt in record["attempts"]] == ["STOPPED", "SUCCEEDED"]
    [fault] = [event for event in record["events"] if event["kind"] == "health.fault"]
    assert fault["details"]["summary"].startswith("GPU fault (XID 79 on GPU 0 on ")
    [drained] = [event for event in record["events"] if event["kind"] == "node.drained"]
    assert drained["details"]["node_ids"] == [faulty]
    [scheduled] = [event for event in record["events"] if event["kind"] == "retry.scheduled"]
    assert scheduled["details"]["delay"] == 0  # the node is drained: nothing to wait for (--retry-backoff 1)
    assert placed(2) not in (None, faulty)  # Ray scheduled nothing new on the drained node


def test_remove_leaves_nothing_behind(deployment: Deployment):
    result = deployment.launcher("exporters", "remove")
    assert result.returncode == 0, result.stderr
    wait_until(lambda: not deployment.raypulse_actors(), 30, "no raypulse actor")
    wait_until(lambda: not exporter_processes(deployment.base_port), 30, "no exporter process")
    status = deployment.launcher("exporters", "status", "-o", "json")
    assert status.returncode == 1
    assert not json.loads(status.stdout)["supervisor"]


def test_a_node_that_cannot_start_its_exporter_fails_the_deploy(deployment: Deployment):
    # The first node's port is taken: its exporter cannot listen, and the deploy says where and why.
    with socket.socket() as blocker:
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # earlier scrapes may linger in TIME_WAIT
        blocker.bind(("0.0.0.0", deployment.base_port))
        blocker.listen()
        result = deployment.deploy("--start-timeout", "30")
        try:
            assert result.returncode == 1, result.stderr
            assert f"1 of {len(deployment.alive_node_ids())} nodes have no working exporter" in result.stderr
            head = next(row for row in deployment.status()["nodes"] if row["role"] == "head")
            assert f"node {head['node_id']}" in result.stderr
            assert "exited with code" in result.stderr
            assert "address already in use" in result.stderr.lower()
        finally:
            removed = deployment.launcher("exporters", "remove")
    assert removed.returncode == 0, removed.stderr
    wait_until(lambda: not exporter_processes(deployment.base_port), 30, "no exporter process")


def test_deploy_with_a_web_config_serves_tls_and_basic_auth_everywhere(deployment: Deployment, tmp_path: Path,
                                                                       monkeypatch):
    import ssl

    import bcrypt
    import trustme

    from launcher.state import load_deployment_access

    monkeypatch.setenv("RAYPULSE_HOME", str(deployment.home))  # where the launcher keeps the deploy's access
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(tmp_path / "server.crt"))
    server.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    (tmp_path / "password").write_text("scrape-password")
    hashed = bcrypt.hashpw(b"scrape-password", bcrypt.gensalt(rounds=10)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                   f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    (tmp_path / "broken.yml").write_text("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n")
    refused = deployment.deploy("--web-config", str(tmp_path / "broken.yml"))
    assert refused.returncode == 2
    assert "--web-config: " in refused.stderr
    assert str(tmp_path / "broken.yml") in refused.stderr
    assert not deployment.raypulse_actors()  # refused before anything was placed

    result = deployment.deploy("--web-config", str(web), "-o", "json")
    try:
        assert result.returncode == 0, result.stderr + result.stdout
        nodes = json.loads(result.stdout)["nodes"]
        assert all(node["url"].startswith("https://") for node in nodes)
        # Nothing secret went on the job's command line or into the supervisor's settings.
        jobs = deployment.cluster.api("/api/jobs/")
        assert not [job for job in jobs if "BEGIN" in json.dumps(job) or hashed in json.dumps(job)]
        access = load_deployment_access(deployment.cluster.dashboard_url)
        assert access is not None
        assert access.username is not None
        report = deployment.status()
        assert report["complete"], report
        assert all(row["exporter_url"].startswith("https://") and row["version"] for row in report["nodes"])
        anyone = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        anyone.check_hostname, anyone.verify_mode = False, ssl.CERT_NONE
        for row in report["nodes"]:
            assert http_get(row["exporter_url"] + "/metrics", context=anyone)[0] == 401
        # The config printed for Prometheus reaches the exporters over TLS with the user's credentials.
        config = deployment.launcher("prometheus-config", "--ca-file", str(tmp_path / "ca.crt"),
                                     "--basic-auth-user", "prometheus", "--basic-auth-password-file",
                                     str(tmp_path / "password"))
        assert config.returncode == 0, config.stderr
        job, ray_job, rollout_job = yaml.safe_load(config.stdout)["scrape_configs"]
        assert job["scheme"] == "https"
        assert job["http_sd_configs"][0]["url"].startswith("https://")
        assert job["basic_auth"] == {"username": "prometheus", "password_file": str(tmp_path / "password")}
        # Ray's metrics agents get no credentials; the read of /sd/ray carries them as /sd's does.
        assert ray_job["job_name"] == wire.RAY_METRICS_JOB
        assert "basic_auth" not in ray_job
        assert "scheme" not in ray_job
        assert ray_job["http_sd_configs"][0]["url"] == job["http_sd_configs"][0]["url"] + "/ray"
        assert ray_job["http_sd_configs"][0]["basic_auth"] == job["basic_auth"]
        # The rollout servers alike (vLLM's own HTTP server): the read of /sd/rollout only.
        assert rollout_job["job_name"] == wire.ROLLOUT_METRICS_JOB
        assert "basic_auth" not in rollout_job
        assert "scheme" not in rollout_job
        assert rollout_job["http_sd_configs"][0]["url"] == job["http_sd_configs"][0]["url"] + "/rollout"
        assert rollout_job["http_sd_configs"][0]["basic_auth"] == job["basic_auth"]
        # Each node's private directory: the web config and the log, this user's only.
        for directory in Path(tempfile.gettempdir()).glob("raypulse-exporter-*-*-*"):
            port = directory.name.split("-")[3]
            if port.isdigit() and deployment.base_port <= int(port) < deployment.base_port + 40:
                assert directory.stat().st_mode & 0o777 == 0o700
                assert all(item.stat().st_mode & 0o777 == 0o600 for item in directory.iterdir())
    finally:
        removed = deployment.launcher("exporters", "remove")
    assert removed.returncode == 0, removed.stderr
    assert load_deployment_access(deployment.cluster.dashboard_url) is None
    wait_until(lambda: not exporter_processes(deployment.base_port), 30, "no exporter process")
