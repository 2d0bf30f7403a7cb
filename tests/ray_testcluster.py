"""A real local Ray cluster for the Ray collector tests: a head and worker raylets on this host,
each with its own free ports (never Ray's defaults), its own temp dir, token auth on, and the
`raypulse.io/exporter-port` node label the launcher sets. Everything it starts is found again by
its temp dir and killed at the end (never `ray stop`, which would stop other people's clusters).

Run Ray tests under `flock /tmp/raypulse-ray.lock` (the launcher's tests start clusters too).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from exporter.contract import wire
from scripts.ports import free_port_range
from tests.conftest import (
    REPO,
    RunningExporter,
    RunningPrometheus,
    binary,
    exporter_command,
    free_port,
    http_get,
    wait_until,
)

# Collector intervals short enough for a test to see a change within seconds.
FAST = {f"{wire.ENV_EXPORTER_PREFIX}COLLECTORS__{name.upper()}__INTERVAL_SECONDS": seconds
        for name, seconds in (("ray", "1"), ("ray_head", "1"), ("ray_processes", "1"), ("train", "0.5"), ("gpu", "1"))}

RAY = str(Path(sys.executable).with_name("ray"))
NODE_PORTS = 50  # a node's exporter and progress ports, Ray's 7 fixed ones, the head's client port, 41 for workers


@dataclass
class RayNode:
    exporter_port: int
    progress_port: int
    head: bool
    args: list[str] = field(default_factory=list)


@dataclass
class RayCluster:
    temp_dir: Path
    token: str
    gcs_port: int
    dashboard_port: int
    nodes: list[RayNode] = field(default_factory=list)

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def env(self, node: RayNode | None = None) -> dict[str, str]:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
               "PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"}
        env.pop("RAY_ADDRESS", None)
        if node is not None:  # what the launcher gives every node: where its exporter takes progress
            env["RAYPULSE_PROGRESS_URL"] = f"http://127.0.0.1:{node.progress_port}"
        return env

    # -- lifecycle ---------------------------------------------------------------------------------

    def start_node(self, node: RayNode) -> None:
        subprocess.run([RAY, "start", *node.args], env=self.env(node), check=True, capture_output=True, timeout=120)

    def add_node(self, *, head: bool, num_cpus: int, exporter_port: int | None = None) -> RayNode:
        # Every port of the node from one free block below the ephemeral range: ports picked one by one
        # by binding to 0 can be handed to some client socket before Ray binds them.
        base = free_port_range(NODE_PORTS)
        node = RayNode(exporter_port or base, base + 1, head)
        common = ["--num-cpus", str(num_cpus), "--object-store-memory", str(80 * 1024 * 1024),
                  "--labels", f"raypulse.io/exporter-port={node.exporter_port}", "--disable-usage-stats",
                  "--node-ip-address", "127.0.0.1",
                  "--node-manager-port", str(base + 2), "--object-manager-port", str(base + 3),
                  "--runtime-env-agent-port", str(base + 4), "--dashboard-agent-grpc-port", str(base + 5),
                  "--dashboard-agent-listen-port", str(base + 6), "--metrics-export-port", str(base + 7),
                  "--min-worker-port", str(base + 9), "--max-worker-port", str(base + NODE_PORTS - 1)]
        if head:
            node.args = ["--head", "--temp-dir", str(self.temp_dir), "--port", str(self.gcs_port),
                         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port),
                         "--include-dashboard", "true", "--ray-client-server-port", str(base + 8), *common]
        else:
            node.args = ["--address", f"127.0.0.1:{self.gcs_port}", *common]
        self.nodes.append(node)
        self.start_node(node)
        return node

    @property
    def head(self) -> RayNode:
        return next(node for node in self.nodes if node.head)

    @property
    def workers(self) -> list[RayNode]:
        return [node for node in self.nodes if not node.head]

    def wait_ready(self, alive_nodes: int, timeout: float = 90) -> None:
        def ready() -> bool:
            nodes = self.api("/api/v0/nodes?limit=100")["data"]["result"]["result"]
            return sum(n["state"] == "ALIVE" for n in nodes) >= alive_nodes
        wait_until(lambda: self._answers() and ready(), timeout, f"{alive_nodes} alive Ray nodes", interval=0.5)

    def _answers(self) -> bool:
        try:
            return self.api_text("/api/gcs_healthz").strip() == "success"
        except (OSError, urllib.error.HTTPError):
            return False

    def processes(self) -> list[int]:
        """Every process of this cluster: its temp dir on the command line or among its open files."""
        marker = str(self.temp_dir)
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes().decode(errors="replace")
                if marker in cmdline:
                    found.append(int(entry.name))
                    continue
                for fd in os.scandir(Path(entry.path, "fd")):
                    if os.readlink(fd.path).startswith(marker):
                        found.append(int(entry.name))
                        break
            except OSError:
                continue
        return found

    def kill(self) -> None:
        """SIGKILL every process of the cluster, until none is left (workers may outlive a raylet briefly)."""
        deadline = time.monotonic() + 30
        while (pids := self.processes()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.3)
        assert not self.processes(), f"Ray processes left behind: {self.processes()}"

    def restart(self) -> None:
        """Start the same nodes again (same ports, labels and temp dir), head first."""
        for node in [self.head, *self.workers]:
            self.start_node(node)

    # -- Jobs API ----------------------------------------------------------------------------------

    def _request(self, path: str, data: dict | None = None) -> bytes:
        request = urllib.request.Request(self.dashboard_url + path, data=json.dumps(data).encode() if data else None,
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read()

    def api(self, path: str, data: dict | None = None):
        return json.loads(self._request(path, data))

    def api_text(self, path: str) -> str:
        return self._request(path).decode()

    def submit(self, entrypoint: str, submission_id: str, metadata: dict[str, str] | None = None) -> None:
        self.api("/api/jobs/", {"entrypoint": entrypoint, "submission_id": submission_id,
                                "metadata": metadata or {}})

    def job(self, submission_id: str) -> dict:
        return self.api(f"/api/jobs/{submission_id}")

    def wait_job(self, submission_id: str, states: set[str], timeout: float = 120) -> dict:
        wait_until(lambda: self.job(submission_id)["status"] in states, timeout,
                   f"job {submission_id} to reach {sorted(states)}", interval=0.5)
        return self.job(submission_id)


def start_cluster(temp_dir: Path, *, worker_cpus: tuple[int, ...] = (2,), head_cpus: int = 1) -> RayCluster:
    """A head and one worker per entry of `worker_cpus`; waits until all are alive."""
    ports = free_port_range(2)
    cluster = RayCluster(temp_dir=temp_dir, token=secrets.token_hex(16), gcs_port=ports, dashboard_port=ports + 1)
    try:
        cluster.add_node(head=True, num_cpus=head_cpus)
        for cpus in worker_cpus:
            cluster.add_node(head=False, num_cpus=cpus)
        cluster.wait_ready(1 + len(worker_cpus))
    except BaseException:
        cluster.kill()
        raise
    return cluster


def start_exporter(log_dir: Path, port: int, *args: str, env: dict[str, str],
                   host: str = "127.0.0.1") -> RunningExporter:
    """`exporter serve` on host:port as a real process (module-scoped tests own its lifetime). Ray
    nodes advertise this host's address, so exporters Prometheus finds through /sd listen on 0.0.0.0."""
    log = log_dir / f"exporter-{port}.log"
    process = subprocess.Popen(exporter_command("serve", "--listen", f"{host}:{port}", *args),
                               stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO, env=env)
    running = RunningExporter(process, f"http://127.0.0.1:{port}", log)
    wait_until(lambda: process.poll() is not None or running.get("/readyz")[0] == 200, 30, "the exporter")
    assert process.poll() is None, log.read_text()
    return running


def stop_process(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def start_prometheus(data_dir: Path, config_yaml: str) -> tuple[subprocess.Popen, RunningPrometheus]:
    port = free_port()
    config = data_dir / "prometheus.yml"
    config.write_text(config_yaml)
    process = subprocess.Popen(
        [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data_dir / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=(data_dir / "prometheus.log").open("wb"), stderr=subprocess.STDOUT)
    running = RunningPrometheus(process, f"http://127.0.0.1:{port}")
    wait_until(lambda: http_get(running.url + "/-/ready")[0] == 200, 60, "Prometheus to become ready")
    return process, running
