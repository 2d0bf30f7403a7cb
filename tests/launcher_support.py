"""Helpers (no tests) for the launcher's end-to-end tests: run `launcher` as a real process with its
own RAYPULSE_HOME, pick free port bases, and find every process a cluster left behind.

Tests that start Ray run under `flock /tmp/raypulse-ray.lock` (see README)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from scripts.ports import free_port_range


def free_base(nodes: int) -> tuple[int, int]:
    """Exporter and progress port bases whose 2 * nodes ports (node i: base + 2i, base + 1 + 2i)
    are all free now."""
    base = free_port_range(2 * nodes)
    return base, base + 1


def env_for(home: Path, **extra: str) -> dict[str, str]:
    # The address variables too: with one set, `launcher submit` would go to that cluster.
    env = {key: value for key, value in os.environ.items()
           if key not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                          "RAY_AUTH_MODE")}
    # HOME too: the launcher reads ~/.ray/auth_token as Ray does, and a test must not find a stray one.
    return {**env, "RAYPULSE_HOME": str(home), "HOME": str(home), **extra}


def launcher(*args: str, home: Path, timeout: float = 240, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, cwd=home,
                          env=env_for(home, **extra_env), timeout=timeout)


def start_launcher(*args: str, home: Path, **extra_env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=home, env=env_for(home, **extra_env))


def status_json(run_id: str, home: Path, *args: str, **extra_env: str) -> dict[str, Any]:
    result = launcher("status", run_id, "--output", "json", *args, home=home, **extra_env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def audit_actions(home: Path) -> list[dict[str, Any]]:
    path = home / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def live(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (zombies are gone already, only not yet reaped by their parent)."""
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.Error:
            continue
    return alive


def cluster_processes(cluster: str) -> list[psutil.Process]:
    """Every live process of a launcher-started cluster: they carry RAYPULSE_CLUSTER_TAG=<name>-<hex>."""
    found = []
    for process in psutil.process_iter():
        try:
            tag = process.environ().get("RAYPULSE_CLUSTER_TAG", "")
            if tag.startswith(f"{cluster}-") and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def describe(processes: list[psutil.Process]) -> list[str]:
    names = []
    for process in processes:
        try:
            names.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
        except psutil.Error:
            continue
    return names


def kind(process: psutil.Process) -> str:
    """raylet, gcs_server, exporter, ray-start, ray:: (a Ray worker), dashboard or other: what the
    SIGINT test counts."""
    try:
        name = process.name()
        line = " ".join(process.cmdline())
    except psutil.Error:
        return "gone"
    if name in ("raylet", "gcs_server"):
        return name
    if "-m exporter serve" in line:
        return "exporter"
    if "/ray start " in line:
        return "ray-start"
    if name.startswith("ray::") or line.startswith("ray::"):
        return "ray::"
    return "dashboard" if "dashboard" in line else "other"


@contextlib.contextmanager
def kept_cluster(name: str, home: Path, workers: int = 1, worker_gpus: int = 0,
                 worker_cpus: int = 1) -> Iterator[dict[str, Any]]:
    """`launcher up` a local cluster (head + workers, with simulated GPUs if asked) for a module's tests;
    `launcher down` after, with nothing of it left running."""
    exporter_port, progress_port = free_base(1 + workers)
    gpus = ["--worker-gpus", str(worker_gpus), "--simulate-gpus"] if worker_gpus else []
    result = launcher("up", "--name", name, "--workers", str(workers), "--worker-cpus", str(worker_cpus), *gpus,
                      "--exporter-port", str(exporter_port), "--progress-port", str(progress_port), home=home)
    assert result.returncode == 0, result.stderr
    yield json.loads((home / "clusters" / name / "cluster.json").read_text())
    result = launcher("down", name, home=home)
    assert result.returncode == 0, result.stderr
    assert not cluster_processes(name), describe(cluster_processes(name))


TIME_WAIT = "06"  # the TCP state's number in /proc/net/tcp (include/net/tcp_states.h)


def time_wait_ports() -> set[int]:
    """The local ports of this host's IPv4 connections in TIME-WAIT (what `ss -tan state time-wait` lists)."""
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == TIME_WAIT:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def closed_by_server(host: str, port: int, request: bytes) -> None:
    """Send one request and read until the server closes the connection, then close ours: the server
    closed first, so its end (local port `port`) stays in TIME-WAIT for the next 60 s."""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(request)
        while sock.recv(65536):
            pass


class SharedCluster:
    """One kept local cluster, `shared` (head + one worker with a simulated GPU), for the tests of any module
    that only submit runs into a cluster and leave it as they found it (tests/conftest.py's `shared_cluster`
    runs them one after another). `launcher up` when the first asks, `launcher down` after the last. Their
    modules use its RAYPULSE_HOME (the launcher finds a cluster only there); their run ids differ.

    A run that mostly waits (minutes of a job's own pace) starts with the cluster and goes on beside the
    other tests: its module names it in `HEAD_START` ({run id: submit arguments after `--run-id`}), its test
    runs last on the cluster and takes the result with `finish(run_id)`."""

    name = "shared"
    # Logical CPUs of its worker: the head starts' jobs run side by side, and one that takes a CPU for a task,
    # an actor or Ray Train's worker must not wait for another's.
    worker_cpus = 4

    def __init__(self, home: Path, head_starts: dict[str, tuple[str, ...]] | None = None) -> None:
        self.home = home
        self._stack = contextlib.ExitStack()
        self._record: dict[str, Any] | None = None
        self._head_starts = dict(head_starts or {})
        self._started: dict[str, subprocess.Popen] = {}

    def record(self) -> dict[str, Any]:
        """The cluster's record (cluster.json), started if need be, with the head-start runs submitted."""
        if self._record is None:
            self._record = self._stack.enter_context(
                kept_cluster(self.name, self.home, worker_gpus=1, worker_cpus=self.worker_cpus))
            self._stack.callback(self._stop_unfinished)  # runs before `launcher down`
            for run_id, args in self._head_starts.items():
                self._started[run_id] = start_launcher("submit", "--cluster", self.name, "--run-id", run_id, *args,
                                                       home=self.home)
        return self._record

    def finish(self, run_id: str, timeout: float) -> subprocess.CompletedProcess:
        """The head-start run's `launcher submit`, waited for to its end (within `timeout` from now)."""
        self.record()
        process = self._started.pop(run_id)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            raise AssertionError(f"{run_id}: `launcher submit` did not end within {timeout:g} s: "
                                 f"{stderr[-2000:]}") from None
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def _stop_unfinished(self) -> None:
        """A head-start run whose test never took it (failed before, or deselected after it began) is
        stopped, its launcher waited for: nothing of it outlives the cluster."""
        for run_id, process in self._started.items():
            launcher("stop", run_id, home=self.home)
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
        self._started.clear()

    def close(self) -> None:
        """`launcher down`, checked to leave nothing running (once; a later record() starts it again)."""
        if self._record is not None:
            self._record = None
            self._stack.close()
