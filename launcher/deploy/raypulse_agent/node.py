"""The actor pinned to one node: runs `python -m exporter serve` there as a subprocess and keeps
it running (the supervisor calls `ensure` every interval; a dead process is started again).

The subprocess dies with the actor: on Linux it gets SIGTERM when its parent exits
(PR_SET_PDEATHSIG), so `ray.kill`, a crashed worker or a lost node leave no exporter behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STDERR_TAIL_BYTES = 2000


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM to the exporter when the actor's process goes away."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


class NodeExporter:
    def __init__(self, node_id: str, host: str, port: int, role: str, config: dict[str, Any]) -> None:
        self.node_id, self.host, self.port, self.role = node_id, host, port, role
        self.start_timeout = float(config.get("start_timeout_s", 60))
        self.command = [sys.executable, "-m", "exporter", "serve", "--listen", f"{host}:{port}",
                        "--ray-dashboard", config["dashboard_url"], "--cluster", config["cluster"],
                        "--ray-role", role, "--ray-node-id", node_id,
                        # Several nodes may share a host (tests, dev boxes): the progress port
                        # follows the metrics port, as the launcher's local clusters do.
                        "--progress-listen", f"127.0.0.1:{port + 1}"]
        if config.get("simulate_gpus"):
            self.command += ["--simulate-gpus", str(config["simulate_gpus"])]
        # One file per node and port, rewritten at each start: a killed actor leaves at most this.
        self.log = Path(tempfile.gettempdir()) / f"raypulse-exporter-{node_id[:12]}-{port}.log"
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.module, self.import_error = self._find_exporter()

    @staticmethod
    def _find_exporter() -> tuple[str | None, str | None]:
        """Where `exporter` comes from here (the runtime env's py_modules when deployed)."""
        try:
            import exporter
        except ImportError as exc:
            return None, f"cannot import the exporter package on this node: {exc}"
        return str(Path(exporter.__file__).parent), None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def ensure(self) -> dict[str, Any]:
        """Start the exporter unless it runs; report whether it answers."""
        if self.import_error:
            return self._report(False, self.import_error)
        if self.process is not None and self.process.poll() is None:
            return self._report(True)
        self._start()
        return self._report(*self._wait_ready())

    def stop(self) -> bool:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.log.unlink(missing_ok=True)
        return True

    def _start(self) -> None:
        env = dict(os.environ)
        if self.module:  # the child imports the same exporter as this actor, ahead of site-packages
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(self.module).parent),
                                                              env.get("PYTHONPATH")]))
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        self.starts += 1

    def _wait_ready(self) -> tuple[bool, str | None]:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False, f"the exporter exited with code {self.process.returncode}"
            if self._healthy():
                return True, None
            time.sleep(0.3)
        return False, f"the exporter did not answer {self.url}/healthz within {self.start_timeout:.0f}s"

    def _healthy(self) -> bool:
        """GET /healthz answers 200. A raw socket, because a client whose ephemeral port happens to
        be the one polled connects to itself (TCP simultaneous open) while nothing listens yet."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            try:
                sock.bind((self.host, 0))
                if sock.getsockname()[1] == self.port:
                    return False
                sock.connect((self.host, self.port))
                sock.sendall(f"GET /healthz HTTP/1.0\r\nHost: {self.host}:{self.port}\r\n\r\n".encode())
                status_line = sock.recv(64).split(b"\r\n", 1)[0].split()
            except OSError:
                return False
        return len(status_line) >= 2 and status_line[0].startswith(b"HTTP/") and status_line[1] == b"200"

    def _tail(self) -> str:
        try:
            data = self.log.read_bytes()
        except OSError:
            return ""
        return data[-STDERR_TAIL_BYTES:].decode(errors="replace")

    def _report(self, ok: bool, error: str | None = None) -> dict[str, Any]:
        running = self.process is not None and self.process.poll() is None
        return {"node_id": self.node_id, "host": self.host, "port": self.port, "role": self.role, "url": self.url,
                "ok": ok, "error": error, "stderr_tail": None if ok else self._tail(),
                "pid": self.process.pid if running and self.process else None, "starts": self.starts,
                "exporter_module": self.module}
