"""Two hosts, each a network namespace on one bridge (scripts/hosts.py): a Ray cluster across them
and an exporter per Ray node, each listening on its host's address; a real Prometheus on host a
finds them through the head exporter's /sd, scrapes across the bridge and evaluates the real alert
rules (at the drill's scale). Then host b is cut off (its link down). The test itself talks to
them from the root namespace, over the bridge.

    host a (10.213.7.2): Ray head (no CPUs) + a Ray worker; two exporters, told their node (--ray-node-id);
                         Prometheus
    host b (10.213.7.3): a Ray worker; its exporter started by hand (no --ray-node-id), named the head's
                         dashboard (--ray-dashboard: the Ray token only goes where it is told or vouched for)

All hosts share one process table, as containers with a shared pid namespace do: each exporter
must still watch only its own host's raylets. Every wait is bounded; the topology, with everything
running in it (all the test starts), is removed even when the test fails, and at the next start
when a run was killed.

Starts Ray: run under `flock /tmp/raypulse-ray.lock`. Needs root (network namespaces).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from alerts import build
from alerts.config import DEFAULT
from alerts.prometheus import config, render, rule_files
from exporter.contract import wire
from scripts import hosts
from scripts.drill.run import FAST_FORS
from tests.conftest import REPO, RunningPrometheus, binary, exporter_command, http_get, wait_until
from tests.ray_testcluster import FAST, RAY

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(hosts.unavailable() is not None, reason=str(hosts.unavailable()))]

CLUSTER = "two-hosts"
GCS_PORT, DASHBOARD_PORT = 6379, 8265  # each host has its own ports: Ray's defaults are free there
EXPORTER_PORT = wire.EXPORTER_PORT
# The drill's scale and short RaypulseExporterDown (FAST_FORS; 10m by default, as kps' TargetDown): 1m becomes 2s.
SCALE = 1 / 30
# Ray declares a node dead after 10 failed health checks (each a 1s timeout and a 1s pause: about
# 20s), well after Prometheus has seen the cut-off exporter down (about 4s: RaypulseExporterDown's
# scaled `for` is 2s) and before the head drops the node from /sd.
HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
                 "RAY_health_check_failure_threshold": "10", "RAY_health_check_initial_delay_ms": "1000"}


@dataclass
class Node:
    host: hosts.Host
    exporter_port: int
    ports: int  # first of this node's block of Ray ports on its host
    head: bool = False
    node_id: str = ""

    @property
    def target(self) -> str:
        return f"{self.host.address}:{self.exporter_port}"

    @property
    def exporter_url(self) -> str:
        return f"http://{self.target}"


@dataclass
class Scene:
    net: hosts.Topology
    token: str
    nodes: dict[str, Node]
    prometheus: RunningPrometheus
    exporters: dict[str, subprocess.Popen] = field(default_factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
               "PYTHONPATH": str(REPO), **extra}
        env.pop("RAY_ADDRESS", None)
        return env

    def query(self, promql: str) -> list[dict]:
        return self.prometheus.query(promql)

    def firing(self, alertname: str) -> list[dict]:
        alerts = self.prometheus.api("/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


def start_ray_node(scene: Scene, node: Node, head_address: str, base: Path) -> None:
    """`ray start` in the node's host, with its own ports and the exporter-port label the launcher sets."""
    p = node.ports
    args = ["--node-ip-address", node.host.address, "--num-cpus", "0" if node.head else "1",
            "--object-store-memory", str(80 * 1024 * 1024), "--disable-usage-stats",
            "--labels", f"{wire.NODE_LABEL_EXPORTER_PORT}={node.exporter_port}",
            "--node-manager-port", str(p), "--object-manager-port", str(p + 1), "--runtime-env-agent-port", str(p + 2),
            "--dashboard-agent-grpc-port", str(p + 3), "--dashboard-agent-listen-port", str(p + 4),
            "--metrics-export-port", str(p + 5), "--min-worker-port", str(p + 10), "--max-worker-port", str(p + 40)]
    if node.head:
        args = ["--head", "--temp-dir", str(base / "ray"), "--port", str(GCS_PORT), "--dashboard-host", "0.0.0.0",
                "--dashboard-port", str(DASHBOARD_PORT), "--include-dashboard", "true",
                "--ray-client-server-port", str(p + 6), *args]
    else:
        args = ["--address", head_address, *args]
    log = base / f"ray-start-{node.host.name}-{node.exporter_port}.log"
    process = node.host.popen([RAY, "start", *args], env=scene.env(**HEALTH_CHECKS), stdout=log.open("wb"),
                              stderr=subprocess.STDOUT)
    try:
        process.wait(120)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"ray start took over 120 s:\n{log.read_text()[-2000:]}") from None
    assert process.returncode == 0, log.read_text()[-2000:]


def dashboard(scene: Scene, path: str):
    status, _, body = http_get(f"http://{scene.nodes['head'].host.address}:{DASHBOARD_PORT}{path}",
                               headers={"Authorization": f"Bearer {scene.token}"}, timeout=10)
    assert status == 200, body[:300]
    return json.loads(body)


def start_exporter(scene: Scene, name: str, *args: str, base: Path) -> None:
    node = scene.nodes[name]
    log = base / f"exporter-{name}.log"
    scene.exporters[name] = node.host.popen(
        exporter_command("serve", "--listen", node.target, "--cluster", CLUSTER, "--progress-listen", "off", *args),
        stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO, env=scene.env(**FAST))


def start_prometheus(host: hosts.Host, data_dir: Path, config_yaml: str) -> RunningPrometheus:
    """Prometheus on `host` (beside the Ray head, as one would run it): everything the test starts runs
    in the topology's namespaces, so leaving it stops everything, even after a killed run."""
    data_dir.mkdir()
    (data_dir / "prometheus.yml").write_text(config_yaml)
    command = [binary("prometheus"), f"--config.file={data_dir / 'prometheus.yml'}", "--log.level=warn",
               f"--storage.tsdb.path={data_dir / 'tsdb'}", f"--web.listen-address={host.address}:9090"]
    process = host.popen(command, stdout=(data_dir / "prometheus.log").open("wb"), stderr=subprocess.STDOUT)
    running = RunningPrometheus(process, f"http://{host.address}:9090")
    wait_until(lambda: process.poll() is not None or http_get(running.url + "/-/ready")[0] == 200, 60,
               "Prometheus to become ready")
    assert process.poll() is None, (data_dir / "prometheus.log").read_text()[-2000:]
    return running


@pytest.fixture(scope="module")
def scene(request: pytest.FixtureRequest) -> Iterator[Scene]:
    for stale in Path("/tmp").glob(f"{hosts.PREFIX}*"):  # an earlier run's (kept after a failure, or killed)
        shutil.rmtree(stale, ignore_errors=True)
    base = Path(tempfile.mkdtemp(prefix=hosts.PREFIX, dir="/tmp"))  # short: Ray's socket paths stay < 108 bytes
    failed_before = request.session.testsfailed
    try:
        with hosts.Topology(["a", "b"]) as net:
            a, b = net["a"], net["b"]
            nodes = {"head": Node(a, EXPORTER_PORT, 20000, head=True), "a2": Node(a, EXPORTER_PORT + 1, 20100),
                     "b": Node(b, EXPORTER_PORT, 20000)}
            scene = Scene(net, secrets.token_hex(16), nodes, prometheus=None)  # type: ignore[arg-type]
            head_address = f"{a.address}:{GCS_PORT}"
            for name in ("head", "a2", "b"):  # one at a time: nodes sharing a temp dir pick socket names there
                start_ray_node(scene, nodes[name], head_address, base)
            wait_until(lambda: sum(n["state"] == "ALIVE" for n in dashboard(scene, "/api/v0/nodes?limit=100")
                                   ["data"]["result"]["result"]) == 3, 60, "3 alive Ray nodes", interval=0.5)
            by_place = {(n["node_ip"], n["labels"].get(wire.NODE_LABEL_EXPORTER_PORT)): n["node_id"]
                        for n in dashboard(scene, "/api/v0/nodes?limit=100&detail=1")["data"]["result"]["result"]}
            for node in nodes.values():
                node.node_id = by_place[(node.host.address, str(node.exporter_port))]

            # Host a: one exporter per Ray node, each told its node (as `launcher exporters deploy` does);
            # the dashboard is found from the head's raylet. Host b: started by hand, told the dashboard.
            start_exporter(scene, "head", "--ray-node-id", nodes["head"].node_id, base=base)
            start_exporter(scene, "a2", "--ray-node-id", nodes["a2"].node_id, base=base)
            start_exporter(scene, "b", "--ray-dashboard", f"http://{a.address}:{DASHBOARD_PORT}", base=base)
            for name, node in nodes.items():
                process = scene.exporters[name]
                wait_until(lambda p=process, n=node: p.poll() is not None or http_get(n.exporter_url + "/readyz")[0]
                           == 200, 30, f"the exporter of {name}")
                assert process.poll() is None, (base / f"exporter-{name}.log").read_text()

            build.write_rules(base / "rules", DEFAULT.with_fors(FAST_FORS).scaled(SCALE))
            scene.prometheus = start_prometheus(a, base / "prometheus", render(config(
                sd_url=f"{nodes['head'].exporter_url}{wire.SD_PATH}", scrape_interval="1s",
                evaluation_interval="1s", rules=rule_files(base / "rules"))))
            yield scene
    finally:
        if request.session.testsfailed > failed_before:
            print(f"\ntest_two_hosts: logs of the failed run (exporters, ray start, Ray, Prometheus) kept in {base} "
                  "until the next run")
        else:
            shutil.rmtree(base, ignore_errors=True)


def by_instance(results: list[dict], label: str = "") -> dict[str, str]:
    return {r["metric"]["instance"]: r["metric"].get(label, "") if label else r["value"][1] for r in results}


def test_prometheus_finds_every_exporter_through_the_head_and_each_sees_only_its_own_node(scene: Scene):
    nodes = scene.nodes
    wait_until(lambda: len(scene.query('up{job="raypulse"} == 1')) == 3, 60, "3 exporters scraped", interval=0.5)
    targets = {r["metric"]["instance"]: r["metric"] for r in scene.query('up{job="raypulse"}')}
    assert set(targets) == {node.target for node in nodes.values()}
    for node in nodes.values():
        assert targets[node.target]["ray_node_id"] == node.node_id
        assert targets[node.target]["role"] == ("head" if node.head else "worker")
        assert targets[node.target]["cluster"] == CLUSTER
    wait_until(lambda: len(scene.query("raypulse_ray_up == 1")) == 3, 60, "every exporter reaches the dashboard",
               interval=0.5)
    # Each exporter watches exactly its own Ray node, though every raylet is in its process table.
    assert by_instance(scene.query("raypulse_ray_local_raylets")) == {node.target: "1" for node in nodes.values()}
    assert by_instance(scene.query("raypulse_ray_node_info"), "node_id") == {
        node.target: node.node_id for node in nodes.values()}
    # Only the head's exporter takes the head role: cluster-wide series come from it alone.
    assert set(by_instance(scene.query("raypulse_ray_nodes"))) == {nodes["head"].target}
    assert http_get(nodes["b"].exporter_url + wire.SD_PATH)[0] == 404


def test_a_host_cut_off_raises_its_alerts_and_the_other_hosts_keep_answering(scene: Scene):
    nodes = scene.nodes
    lost = nodes["b"]
    wait_until(lambda: len(scene.query('up{job="raypulse"} == 1')) == 3, 60, "3 exporters scraped", interval=0.5)
    lost.host.cut()

    # Prometheus cannot scrape host b: its exporter is down (`for` 2s at this scale) ...
    exporter_down = f'ALERTS{{alertname="RaypulseExporterDown", alertstate="firing", instance="{lost.target}"}}'
    wait_until(lambda: scene.query(f"max_over_time({exporter_down}[10m])"), 60, "RaypulseExporterDown for host b",
               interval=0.5)
    # ... then Ray declares its node dead: the node is lost, and /sd stops listing it.
    wait_until(lambda: [a for a in scene.firing("RaypulseRayNodeLost")
                        if a["labels"].get("ray_node_id") == lost.node_id], 90, "RaypulseRayNodeLost for host b",
               interval=0.5)
    [alert] = [a for a in scene.firing("RaypulseRayNodeLost") if a["labels"].get("ray_node_id") == lost.node_id]
    assert alert["labels"]["node"] == lost.host.address
    assert alert["labels"]["cluster"] == CLUSTER
    wait_until(lambda: lost.target not in http_get(nodes["head"].exporter_url + wire.SD_PATH)[2].decode(), 30,
               "/sd to drop the dead node")

    # Nothing else: the exporters of host a were never down, and the head stayed reachable.
    ever_down = scene.query('max_over_time(ALERTS{alertname="RaypulseExporterDown", alertstate="firing"}[10m])')
    assert {r["metric"]["instance"] for r in ever_down} == {lost.target}
    assert not scene.firing("RaypulseRayHeadUnreachable")
    # Host a's exporters keep answering, and keep collecting (no collector stuck on the lost host).
    for name in ("head", "a2"):
        status, _, body = http_get(nodes[name].exporter_url + "/metrics", timeout=5)
        assert status == 200, name
        assert b"raypulse_ray_up 1.0" in body, name
    fresh = ("time() - raypulse_exporter_collector_last_success_timestamp_seconds"
             f'{{instance="{nodes["head"].target}", collector=~"ray|ray_head|ray_processes"}} < 10')
    wait_until(lambda: len(scene.query(fresh)) == 3, 30, "the head's Ray collectors to run")
    assert len(scene.query('up{job="raypulse"} == 1')) == 2

    # The exporter on the lost host still answers there, and says it cannot reach Ray.
    probe = ("import sys, urllib.request\n"
             "body = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()\n"
             "sys.exit(0 if 'raypulse_ray_up 0.0' in body else 1)\n")
    wait_until(lambda: lost.host.run([sys.executable, "-c", probe, lost.exporter_url + "/metrics"],
                                     capture_output=True, timeout=30).returncode == 0, 30,
               "host b's exporter to answer and report Ray unreachable")
