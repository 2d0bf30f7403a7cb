"""A Ray cluster on this machine: one head (driver only), the workers of the spec, one exporter per
node, token authentication, its own temp dir, and a teardown that leaves no process behind.

With `exporter_web_config`, the exporters serve TLS and basic auth from the launcher's copy of that
file (launcher/exporter_plan.py), and the record says how the launcher reaches them (ExporterAccess).

Every node is a `ray start --block` child in its own session: that process owns the node's Ray
processes and kills them when it gets SIGTERM (Ray's own shutdown hook), and a terminal's Ctrl-C
reaches only the launcher, which then stops the job first. Every process of the cluster also
carries RAYPULSE_CLUSTER_TAG in its environment (Ray's workers inherit it from the raylet), so
the teardown can find and kill whatever outlived its parent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from exporter.config import ConfigError
from exporter.contract import wire
from launcher.errors import BadInput, Cancelled, InfraError
from launcher.exporter_plan import PROGRESS_HOST, ExporterPlan, prepare_web_config
from launcher.health import stacks
from launcher.journal import Journal
from launcher.raydash import RayDashboard
from launcher.spec import JobSpec
from launcher.state import ClusterRecord, ExporterAccess, ExporterRef, ProcessRef, cluster_dir, write_token

HEAD_OBJECT_STORE = 256 * 2**20  # the head holds only the driver's objects
WORKER_OBJECT_STORE = 512 * 2**20  # per worker, unless it has a memory size (then 20% of it)
START_TIMEOUT_S = 180.0
POLL_S = 0.25
STOP_GRACE_S = 15.0
ORPHAN_GRACE_S = 3.0  # for a node's processes left behind once the node itself has gone


class ClusterError(InfraError):
    """The local cluster could not be started; the message says which node and shows its log."""


class PortInUse(BadInput):
    """A fixed port the spec asks for is taken (bad input: nothing was started)."""


def _free_ports(count: int, taken: Collection[int] = ()) -> list[int]:
    """`count` distinct ports no one listens on now, none of them `taken`. The sockets stay open until all
    are picked: one at a time, the kernel may hand a port just let go out again, and Ray refuses a node
    whose two components were given the same port."""
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket()
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if port not in taken:
                ports.append(port)
        return ports
    finally:
        for sock in sockets:
            sock.close()


def _ray_cli() -> str:
    """The `ray` command of this interpreter's environment, so nodes run the same Ray as the client."""
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


@dataclass
class NodePlan:
    name: str  # "head" or "<group>-<i>"
    role: str
    exporter: ExporterPlan
    args: list[str] = field(default_factory=list)  # `ray start` arguments


def plan_nodes(spec: JobSpec, cluster: str, gcs_port: int, dashboard_port: int) -> list[NodePlan]:
    """Head first, then each group's workers. Node i (head = 0) serves metrics on exporter_port + 2i
    and progress on progress_port + 2i: the defaults 9477/9478 are the exporter's own, and the
    nodes' pairs interleave without colliding."""
    dashboard = f"http://127.0.0.1:{dashboard_port}"
    # Ray's client server on the head, its agent and metrics export ports on every node: all distinct.
    count = 1 + 2 * (1 + sum(group.count for group in spec.worker_groups))
    ports = iter(_free_ports(count, taken=(gcs_port, dashboard_port)))

    def gpu_control(node: str) -> str:
        """The node's fault-injection file; one shared file when the user's environment names one
        (RAYPULSE_EXPORTER_GPU__CONTROL_FILE, which the exporters would read anyway)."""
        return os.environ.get(wire.ENV_GPU_CONTROL_FILE) or str(cluster_dir(cluster) / f"gpus-{node}.json")

    def exporter(node: str, role: str, index: int, gpus: int) -> ExporterPlan:
        return ExporterPlan(node=node, role=role, port=spec.exporter_port + 2 * index,
                            progress_port=spec.progress_port + 2 * index, dashboard_url=dashboard, cluster=cluster,
                            simulate_gpus=gpus if spec.simulate_gpus else 0,
                            gpu_control=gpu_control(node) if spec.simulate_gpus and gpus else None)

    def labels(plan: ExporterPlan, group: str) -> str:
        return (f"{wire.NODE_LABEL_EXPORTER_PORT}={plan.port},{wire.NODE_LABEL_NODE}={plan.node},"
                f"{wire.NODE_LABEL_GROUP}={group}")

    head_exporter = exporter("head", "head", 0, 0)
    head = NodePlan("head", "head", head_exporter, [
        "--head", "--port", str(gcs_port), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port),
        "--ray-client-server-port", str(next(ports)), "--num-cpus", "0", "--num-gpus", "0",
        "--object-store-memory", str(HEAD_OBJECT_STORE), "--labels", labels(head_exporter, "head"),
    ] + (["--resources", json.dumps(spec.head.resources)] if spec.head.resources else []))
    nodes = [head]
    for number, group in enumerate(spec.worker_groups):
        if group.cpus != int(group.cpus):
            raise BadInput(f"worker_groups[{number}].cpus: a local worker has whole CPUs (got {group.cpus})")
        store = int(group.memory * 0.2) if group.memory else WORKER_OBJECT_STORE
        for i in range(group.count):
            name = f"{group.name}-{i + 1}"
            plan = exporter(name, "worker", len(nodes), group.gpus)
            args = ["--address", f"127.0.0.1:{gcs_port}", "--num-cpus", str(int(group.cpus)),
                    "--num-gpus", str(group.gpus), "--object-store-memory", str(max(store, 80 * 2**20)),
                    "--labels", labels(plan, group.name)]
            if group.memory:
                args += ["--memory", str(group.memory)]
            if group.resources:
                args += ["--resources", json.dumps(group.resources)]
            nodes.append(NodePlan(name, "worker", plan, args))
    for node in nodes:
        node.args = ["start", "--block", "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
                     "--dashboard-agent-listen-port", str(next(ports)), "--metrics-export-port", str(next(ports)),
                     *node.args]
    return nodes


def check_ports(nodes: list[NodePlan]) -> None:
    """The fixed exporter and progress ports must be distinct and free before anything starts: free
    as the exporter binds them (a port whose last connections linger in TIME-WAIT is free). /metrics
    will listen on the node's IP, known once Ray reports it: a listener on any IPv4 address counts."""
    from exporter.serving.binding import can_listen  # asyncio's bind, the exporter's: for a start only

    planned = [port for node in nodes for port in (node.exporter.port, node.exporter.progress_port)]
    if len(set(planned)) != len(planned):
        raise PortInUse("exporter_port: with progress_port, it gives two nodes the same port (node i uses "
                        "exporter_port + 2i and progress_port + 2i); pick bases that differ by an odd number")
    for node in nodes:
        for what, host, port in (("exporter_port", "0.0.0.0", node.exporter.port),
                                 ("progress_port", PROGRESS_HOST, node.exporter.progress_port)):
            if not can_listen(host, port):
                flag = "--" + what.replace("_", "-")
                raise PortInUse(f"{what}: port {port} ({node.name}'s exporter) is in use; pass {flag} with a free "
                                "base port (node i uses base + 2i), or `launcher down` a kept cluster")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalCluster:
    """Start with `start()`, end with `teardown()`; `record` describes the running cluster."""

    def __init__(self, spec: JobSpec, name: str, journal: Journal, cancel: threading.Event | None = None,
                 kept: bool = False, defer_exporters: bool = False) -> None:
        self.spec = spec
        self.journal = journal  # the run's, or one of its own for `launcher up`
        self.name = name
        self.reporter = journal.reporter
        self.cancel = cancel or threading.Event()
        self.kept = kept
        self.record: ClusterRecord | None = None
        self._processes: list[tuple[subprocess.Popen, ProcessRef]] = []
        self._nodes: list[NodePlan] = []
        self._defer_exporters = defer_exporters
        self._exporters_started = False
        self._removed: set[str] = set()  # nodes taken out on purpose (replaced or retired): not "lost"
        self._generation: dict[str, int] = {}  # how many times a node was replaced (its temp dir's suffix)

    @classmethod
    def adopt(cls, record: ClusterRecord, journal: Journal, cancel: threading.Event | None = None) -> LocalCluster:
        """A cluster started by an earlier launcher process, from its record (for its teardown)."""
        cluster = cls(JobSpec(entrypoint="true"), record.name, journal, cancel, kept=record.kept)  # spec: unused
        cluster.record = record
        cluster._exporters_started = True  # they were started with it, or are not coming back
        return cluster

    # --- start -------------------------------------------------------------------------------

    def start(self) -> ClusterRecord:
        """Start every node and exporter and wait until Ray lists every node alive. On any failure
        or cancel, whatever started is torn down before the exception leaves."""
        gcs_port, dashboard_port = _free_ports(2)
        nodes = self._nodes = plan_nodes(self.spec, self.name, gcs_port, dashboard_port)
        check_ports(nodes)
        if cluster_dir(self.name).joinpath("cluster.json").exists():
            raise PortInUse(f"cluster: a cluster named {self.name!r} is already running; `launcher down {self.name}`")
        access = self._web_config(nodes)
        self.journal.emit("cluster.starting", cluster=self.name, nodes=len(nodes))
        token = secrets.token_hex(32)
        token_path = write_token(self.name, token)
        temp_dir = tempfile.mkdtemp(prefix="rp-")  # short: Ray's socket paths must stay under 107 bytes
        self.record = ClusterRecord(
            name=self.name, address=f"http://127.0.0.1:{dashboard_port}", gcs_address=f"127.0.0.1:{gcs_port}",
            token_path=str(token_path), temp_dir=temp_dir, tag=f"{self.name}-{secrets.token_hex(4)}", kept=self.kept,
            exporter_access=access,
            exporters=[ExporterRef(node=n.name, role=n.role, url=n.exporter.url, progress_url=n.exporter.progress_url,
                                   gpu_control=n.exporter.gpu_control) for n in nodes])
        self.record.save()
        started = time.monotonic()
        try:
            self._start_nodes(nodes, token_path)
        except BaseException as exc:
            keep_logs = isinstance(exc, ClusterError)
            self.journal.emit("cluster.failed", cluster=self.name, logs=temp_dir if keep_logs else None,
                              result="cancelled" if isinstance(exc, Cancelled) else f"error: {exc}")
            self.teardown(quiet=True, keep_temp=keep_logs)
            raise
        self.journal.emit("cluster.up", cluster=self.name, nodes=len(nodes), address=self.record.address,
                          seconds=round(time.monotonic() - started, 2), kept=self.kept)
        return self.record

    def _web_config(self, nodes: list[NodePlan]) -> ExporterAccess | None:
        """The exporters' web config, the launcher's copy written beside the record; nothing has started
        yet, so a file that stopped being usable since the spec was checked is still bad input."""
        source = self.spec.exporter_web_config
        if source is None:
            return None
        try:
            access = prepare_web_config(source, cluster_dir(self.name))
        except (ConfigError, OSError) as exc:
            shutil.rmtree(cluster_dir(self.name), ignore_errors=True)
            raise BadInput(f"exporter_web_config: {exc}; fix the file, or leave --exporter-web-config out") from None
        for node in nodes:
            node.exporter = dataclasses.replace(node.exporter, web_config=access.web_config,
                                                tls=access.tls_trust_file is not None)
        return access

    def _environment(self, token_path: Path, node: NodePlan) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items()
               if key not in (wire.ENV_RAY_ADDRESS, wire.ENV_RAY_API_SERVER_ADDRESS, wire.ENV_RAY_AUTH_TOKEN,
                              wire.ENV_PROGRESS_URL)}
        env.update({
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token_path),
            "RAY_USAGE_STATS_ENABLED": "0",
            # Stacks of a hung job through the dashboard's py-spy endpoint (off by default in recent Ray).
            stacks.PROFILING_ENV: "1",
            # No drain on SIGTERM: the launcher stops a node only to be rid of it, with its jobs stopped first,
            # and a detached actor (Ray Train leaves one) would hold the drain for the whole grace.
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
            # `python` in an entrypoint is this environment's Python, the one that has Ray.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            wire.ENV_CLUSTER_TAG: self.record.tag,
        })
        if node.exporter.progress_url:
            env[wire.ENV_PROGRESS_URL] = node.exporter.progress_url
        return env

    def _spawn(self, command: list[str], env: dict[str, str], log: Path, role: str, node: str) -> subprocess.Popen:
        with log.open("ab") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        ref = ProcessRef(pid=process.pid, create_time=psutil.Process(process.pid).create_time(), role=role, node=node)
        self._processes.append((process, ref))
        self.record.processes.append(ref)
        self.record.save()
        return process

    def _start_nodes(self, nodes: list[NodePlan], token_path: Path) -> None:
        temp = Path(self.record.temp_dir)
        dashboard = RayDashboard(self.record.address, token_path.read_text().strip())
        ray = _ray_cli()
        head, workers = nodes[0], nodes[1:]
        ray_processes: dict[str, subprocess.Popen] = {}

        def start_node(node: NodePlan, index: int) -> None:
            self.reporter.step(node.name, f"starting {node.name}")
            ray_processes[node.name] = self._spawn(
                [ray, *node.args, "--temp-dir", str(temp / ("h" if node.role == "head" else f"w{index}"))],
                self._environment(token_path, node), temp / f"{node.name}.log", node.role, node.name)

        # All nodes start at once: a worker's `ray start` waits for the head's GCS by itself, and
        # their Python start-up overlaps the head's. Each node has its own temp dir (nodes sharing
        # one race for the same socket names).
        start_node(head, 0)
        for index, node in enumerate(workers, start=1):
            start_node(node, index)
        expected = {str(node.exporter.port): node.name for node in nodes}
        alive: set[str] = set()
        node_ips: dict[str, str] = {}

        def all_alive() -> bool:
            reply = dashboard.get_json("/api/v0/nodes?detail=1&limit=1000", timeout=2.0)
            for item in reply["data"]["result"]["result"]:
                port = (item.get("labels") or {}).get(wire.NODE_LABEL_EXPORTER_PORT)
                if item.get("state") == "ALIVE" and port in expected and expected[port] not in alive:
                    alive.add(expected[port])
                    node_ips[expected[port]] = item.get("node_ip") or "127.0.0.1"
                    self.reporter.done(expected[port], f"{expected[port]} alive")
            return len(alive) == len(nodes)

        self.journal.emit("cluster.nodes_started", cluster=self.name, nodes=len(nodes))
        self._wait(all_alive, ray_processes, temp, "every node to be alive")
        for node in nodes:
            node.exporter = dataclasses.replace(node.exporter, host=node_ips[node.name])
        self.record.exporters = [ExporterRef(node=n.name, role=n.role, url=n.exporter.url,
                                             progress_url=n.exporter.progress_url,
                                             gpu_control=n.exporter.gpu_control) for n in nodes]
        self.record.save()
        if not self._defer_exporters:
            self.start_exporters()

    # --- nodes that fail ------------------------------------------------------------------------

    def dead_nodes(self) -> list[str]:
        """Nodes whose `ray start --block` process exited without the launcher asking."""
        return sorted(ref.node for process, ref in self._processes
                      if ref.role != "exporter" and process.poll() is not None and ref.node not in self._removed)

    def replace_node(self, name: str) -> float:
        """Stop a worker node (its Ray processes and exporter) and start a fresh one with the same
        group spec, labels and exporter ports, with healthy (simulated) GPUs; returns the seconds it
        took. Raises ClusterError when the fresh node does not come up."""
        started = time.monotonic()
        node = self._worker(name)
        self._stop_node(name)
        self._reset_gpus(node)
        generation = self._generation[name] = self._generation.get(name, 0) + 1
        token_path = Path(self.record.token_path)
        temp = Path(self.record.temp_dir)
        index = self._nodes.index(node)
        since = time.time() - 1  # the fresh node registers after this; the dead one's entry stays, DEAD
        process = self._spawn([_ray_cli(), *node.args, "--temp-dir", str(temp / f"w{index}r{generation}")],
                              self._environment(token_path, node), temp / f"{name}.log", node.role, name)
        self._removed.discard(name)
        dashboard = RayDashboard(self.record.address, token_path.read_text().strip())
        port = str(node.exporter.port)

        def fresh_alive() -> bool:
            reply = dashboard.get_json("/api/v0/nodes?detail=1&limit=1000", timeout=2.0)
            return any(item.get("state") == "ALIVE" and (item.get("labels") or {}).get(wire.NODE_LABEL_EXPORTER_PORT)
                       == port and (item.get("start_time_ms") or 0) / 1000 >= since
                       for item in reply["data"]["result"]["result"])

        self._wait(fresh_alive, {name: process}, temp, f"the fresh {name} to be alive")
        if self._exporters_started:
            self._spawn(node.exporter.command(), self._environment(token_path, node),
                        temp / f"exporter-{name}.log", "exporter", name)
        return time.monotonic() - started

    def retire_node(self, name: str) -> None:
        """Stop a worker node for good: the run goes on without it."""
        self._worker(name)
        self._stop_node(name)

    def _worker(self, name: str) -> NodePlan:
        node = next((node for node in self._nodes if node.name == name), None)
        if node is None or node.role != "worker" or self.record is None:
            raise ClusterError(f"{name} is not a worker node of cluster {self.name}; only workers are replaced")
        return node

    def _stop_node(self, name: str) -> None:
        """SIGTERM the node's processes and its exporter, then SIGKILL what is left of them."""
        self._removed.add(name)
        mine = [(process, ref) for process, ref in self._processes if ref.node == name]
        parents = []
        for process, _ in mine:
            with contextlib.suppress(psutil.Error):
                parents.append(psutil.Process(process.pid))
        for leftover in terminate(parents, STOP_GRACE_S):
            with contextlib.suppress(psutil.Error):
                leftover.kill()
        for process, _ in mine:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(1)
        self._processes = [(process, ref) for process, ref in self._processes if ref.node != name]
        self.record.processes = [ref for ref in self.record.processes if ref.node != name]
        self.record.save()

    @staticmethod
    def _reset_gpus(node: NodePlan) -> None:
        """A replaced node comes with healthy GPUs: its own fault-injection file starts empty (a file
        the user shares between nodes is theirs, and left alone)."""
        control = node.exporter.gpu_control
        if control and control != os.environ.get(wire.ENV_GPU_CONTROL_FILE):
            Path(control).unlink(missing_ok=True)

    def start_exporters(self) -> None:
        """One exporter per node, not awaited: nothing waits for metrics, and on a small machine
        their start-up should not compete with the nodes' or the job's (submit() starts them once
        the job runs). One that dies is reported at teardown with its log."""
        if self.record is None or self._exporters_started:
            return
        self._exporters_started = True
        temp, token_path = Path(self.record.temp_dir), Path(self.record.token_path)
        for node in self._nodes:
            self._spawn(node.exporter.command(), self._environment(token_path, node),
                        temp / f"exporter-{node.name}.log", "exporter", node.name)

    def report_dead_exporters(self) -> None:
        for process, ref in self._processes:
            if ref.role == "exporter" and process.poll() is not None:
                log = Path(self.record.temp_dir) / f"exporter-{ref.node}.log"
                self.reporter.warn(f"the exporter of {ref.node} exited early (code {process.returncode}); its log "
                                   f"ends with:\n{_tail(log, 5)}")

    def _wait(self, ready, ray_processes: dict[str, subprocess.Popen], temp: Path, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.cancel.is_set():
                raise Cancelled(f"interrupted while waiting for {what}")
            for node, process in ray_processes.items():
                if process.poll() is not None:
                    raise ClusterError(f"{node} exited with code {process.returncode} while waiting for {what}; "
                                       f"its log ({temp / f'{node}.log'}) ends with:\n{_tail(temp / f'{node}.log')}")
            try:
                if ready():
                    return
            except (OSError, ValueError, KeyError, TypeError):
                pass  # not up yet
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {START_TIMEOUT_S:.0f}s waiting for {what}; logs in {temp}")
            self.cancel.wait(POLL_S)

    # --- teardown ----------------------------------------------------------------------------

    def teardown(self, quiet: bool = False, keep_temp: bool = False) -> None:
        """Stop every process of the cluster, then forget it."""
        if self.record is None:
            return
        started = time.monotonic()
        if not quiet:
            self.report_dead_exporters()
        self.journal.emit("cluster.teardown", cluster=self.name, show=not quiet)
        left = stop_cluster_processes(self.record)
        for process, _ in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(1)  # reap our children
        forget_cluster(self.record, keep_temp=keep_temp)
        self.journal.emit("cluster.down", cluster=self.name, seconds=round(time.monotonic() - started, 2),
                          killed=left or None, show=not quiet)
        self.record = None


def _matching(ref: ProcessRef) -> psutil.Process | None:
    try:
        process = psutil.Process(ref.pid)
        return process if abs(process.create_time() - ref.create_time) < 0.01 else None
    except psutil.Error:
        return None


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries this cluster's tag (the launcher's own never does)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.status() != psutil.STATUS_ZOMBIE \
                    and process.environ().get(wire.ENV_CLUSTER_TAG) == tag:
                found.append(process)
        except psutil.Error:
            continue
    return found


def terminate(processes: list[psutil.Process], grace: float) -> list[psutil.Process]:
    """SIGTERM the processes, wait up to `grace` for them, then SIGTERM what is left of their
    descendants (taken before they go: Ray starts its agents without our tag in their environment)
    and give those ORPHAN_GRACE_S: once a node's `ray start --block` has gone, nothing else will stop a
    job's entrypoint or a worker it left behind. One that is stopped (SIGSTOP: a hang drill's ranks, a
    frozen exporter) is continued too, since it cannot act on SIGTERM before. Returns the ones still
    alive, for SIGKILL."""
    descendants: dict[int, psutil.Process] = {}
    for process in processes:
        with contextlib.suppress(psutil.Error):
            descendants.update((child.pid, child) for child in process.children(recursive=True))
    _signal(processes, signal.SIGTERM)
    _signal([process for process in [*processes, *descendants.values()] if _stopped(process)], signal.SIGCONT)
    _, alive = psutil.wait_procs(processes, timeout=grace)
    left = [process for process in descendants.values() if _running(process)]
    _signal(left, signal.SIGTERM)
    return psutil.wait_procs(alive + left, timeout=ORPHAN_GRACE_S)[1]


def _signal(processes: list[psutil.Process], number: signal.Signals) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(number)


def _stopped(process: psutil.Process) -> bool:
    try:
        return process.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def stop_cluster_processes(record: ClusterRecord, grace: float = STOP_GRACE_S) -> int:
    """SIGTERM the nodes and exporters (each `ray start --block` stops its node's Ray processes),
    wait, then SIGKILL anything of the cluster still alive. Returns how many needed SIGKILL."""
    alive = terminate([process for process in map(_matching, record.processes) if process is not None], grace)
    # What remains: a node that ignored SIGTERM for the whole grace (killed now), or a Ray process that
    # outlived its parent (a few seconds to exit on its own first).
    deadline = time.monotonic() + 5
    orphans = [process for process in tagged_processes(record.tag) if process.pid not in {p.pid for p in alive}]
    while orphans and time.monotonic() < deadline:
        time.sleep(0.2)
        orphans = [process for process in orphans if _running(process)]
    stragglers = alive + orphans
    for process in stragglers:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(stragglers, timeout=5)
    return len(stragglers)


def forget_cluster(record: ClusterRecord, keep_temp: bool = False) -> None:
    if not keep_temp:
        shutil.rmtree(record.temp_dir, ignore_errors=True)
    shutil.rmtree(record.directory, ignore_errors=True)
