"""The actor pinned to one node: runs `python -m exporter serve` there as a subprocess and keeps
it running (the supervisor calls `ensure` every interval; a dead process is started again).

The subprocess dies with the actor: on Linux it gets SIGTERM when its parent exits
(PR_SET_PDEATHSIG), so `ray.kill`, a crashed worker or a lost node leave no exporter behind.

What the actor writes on the node lives in a private directory of its own (mkdtemp: 0700, files
0600, opened without following links): the exporter's log and, with `launcher exporters deploy
--web-config`, the web config and certificates it was given. A directory an earlier actor of the
same node and port left behind (a crash) is removed when the next one starts; stop() removes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import WEB_CONFIG_FILE

STDERR_TAIL_BYTES = 2000
PRIVATE_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM to the exporter when the actor's process goes away."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _write_private(path: Path, data: str) -> None:
    fd = os.open(path, PRIVATE_FILE, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(data)


def _private_directory(prefix: str) -> Path:
    """A fresh 0700 directory, after removing this user's leftovers of the same prefix (never a link)."""
    base = Path(tempfile.gettempdir())
    for old in base.glob(prefix + "*"):
        with contextlib.suppress(OSError):
            info = old.lstat()
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
                shutil.rmtree(old)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


class NodeExporter:
    def __init__(self, node_id: str, host: str, port: int, role: str, config: dict[str, Any],
                 web_files: dict[str, str] | None = None) -> None:
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
        self.directory = _private_directory(f"raypulse-exporter-{node_id[:12]}-{port}-")
        self.log = self.directory / "exporter.log"  # rewritten at each start
        self.tls = bool(config.get("tls"))
        if web_files:
            for name, content in web_files.items():
                _write_private(self.directory / Path(name).name, content)
            self.command += ["--web-config", str(self.directory / WEB_CONFIG_FILE)]
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
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

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
        shutil.rmtree(self.directory, ignore_errors=True)
        return True

    def _start(self) -> None:
        env = dict(os.environ)
        if self.module:  # the child imports the same exporter as this actor, ahead of site-packages
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(self.module).parent),
                                                              env.get("PYTHONPATH")]))
        self.log.unlink(missing_ok=True)
        with os.fdopen(os.open(self.log, PRIVATE_FILE, 0o600), "wb") as log:
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
        """GET /healthz answers 200, or 401 under basic auth (the exporter answers; the actor holds no
        password). A raw socket, because a client whose ephemeral port happens to be the one polled
        connects to itself (TCP simultaneous open) while nothing listens yet. Over TLS the certificate
        is not checked: this asks a process of this node whether it is up, and sends nothing."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as raw:
            raw.settimeout(2)
            try:
                raw.bind((self.host, 0))
                if raw.getsockname()[1] == self.port:
                    return False
                raw.connect((self.host, self.port))
                sock = raw
                if self.tls:
                    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
                    sock = context.wrap_socket(raw)
                with sock:  # the TLS socket took over the raw one's descriptor
                    sock.sendall(f"GET /healthz HTTP/1.0\r\nHost: {self.host}:{self.port}\r\n\r\n".encode())
                    status_line = sock.recv(64).split(b"\r\n", 1)[0].split()
            except OSError:  # ssl.SSLError is one
                return False
        return len(status_line) >= 2 and status_line[0].startswith(b"HTTP/") and status_line[1] in (b"200", b"401")

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
