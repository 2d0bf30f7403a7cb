"""Real HTTP servers on 127.0.0.1 that stand in for exporters the launcher reads: a well-behaved one whose
exposition a test sets, and raw-socket ones that answer the way a dying, slow or hostile exporter does
(a body cut short, a gzip bomb, a trickle, garbage). Each runs in a thread; use them as context managers.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from exporter.contract import wire

HEADERS_END = b"\r\n\r\n"


class ExporterLike:
    """Serves `text` (what the test sets) at /metrics, gzipped when asked, and /sd from `groups`."""

    def __init__(self, text: str = "") -> None:
        self.text = text
        self.groups: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == wire.SD_PATH:
                    body, encoding = json.dumps(owner.groups).encode(), None
                else:
                    body, encoding = owner.text.encode(), None
                    if "gzip" in (self.headers.get("Accept-Encoding") or ""):
                        body, encoding = gzip.compress(body), "gzip"
                self.send_response(200)
                if encoding:
                    self.send_header("Content-Encoding", encoding)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.address = f"127.0.0.1:{self.server.server_port}"
        self.url = f"http://{self.address}"

    def list_target(self, address: str, node: str) -> None:
        """Add a target group to this server's /sd (in the head exporter's shape)."""
        self.groups.append({"targets": [address], "labels": {"cluster": "c", "node": node}})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ExporterLike:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Answer = Callable[[socket.socket, "RawServer"], None]


class RawServer:
    """Reads each request's head, then lets `answer` write whatever bytes it likes and closes."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.sent = 0  # bytes `answer` got onto the wire, all connections together
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.url = f"http://{self.address}"
        threading.Thread(target=self._accept, daemon=True).start()

    def send(self, connection: socket.socket, data: bytes) -> None:
        connection.sendall(data)
        self.sent += len(data)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(10)
            head = b""
            try:
                while HEADERS_END not in head:
                    chunk = connection.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                self.answer(connection, self)
            except OSError:  # the reader gave up and closed: what the trickle waits for
                pass

    def close(self) -> None:
        self._listener.close()

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the ways an exporter answers badly ----------------------------------------------------------------

TRAIN_STEP = 'raypulse_train_step{job_id="",submission_id="s-a1",rank="0"} 7\n'
TRICKLE_BYTES, TRICKLE_EVERY_S = 40, 0.5  # a byte each half second, more often than any read's socket timeout:
# whole after 20 s, long past a read's deadline


def head(*headers: str, status: str = "200 OK") -> bytes:
    return ("\r\n".join([f"HTTP/1.1 {status}", *headers]) + "\r\n\r\n").encode()


def cut_short(connection: socket.socket, server: RawServer) -> None:
    """An exporter killed mid-answer: Content-Length promises more than comes before the close."""
    server.send(connection, head("Content-Type: text/plain", "Content-Length: 100000") + TRAIN_STEP.encode() * 10)


def gzip_bomb(inflated: int) -> Answer:
    """A small gzip body that inflates to `inflated` bytes of zeros."""
    compressor, zeros = zlib.compressobj(6, zlib.DEFLATED, 31), bytes(2**20)
    body = b"".join(compressor.compress(zeros) for _ in range(inflated // len(zeros))) + compressor.flush()

    def answer(connection: socket.socket, server: RawServer) -> None:
        server.send(connection, head("Content-Encoding: gzip", f"Content-Length: {len(body)}") + body)

    return answer


def trickle_body(connection: socket.socket, server: RawServer) -> None:
    """Headers at once, then the body a byte at a time."""
    server.send(connection, head(f"Content-Length: {TRICKLE_BYTES}"))
    for byte in b"x" * TRICKLE_BYTES:
        time.sleep(TRICKLE_EVERY_S)
        server.send(connection, bytes([byte]))


def trickle_headers(connection: socket.socket, server: RawServer) -> None:
    """The status line, then the headers a byte at a time."""
    server.send(connection, b"HTTP/1.1 200 OK\r\n")
    for byte in b"X-Slow: " + b"y" * TRICKLE_BYTES:
        time.sleep(TRICKLE_EVERY_S)
        server.send(connection, bytes([byte]))


def not_http(connection: socket.socket, server: RawServer) -> None:
    server.send(connection, b"\x00\xff\xfe garbage \x1b[2J\r\n\r\n")


def not_gzip(connection: socket.socket, server: RawServer) -> None:
    server.send(connection, head("Content-Encoding: gzip", "Content-Length: 12") + b"not gzip at all"[:12])


def not_an_exposition(connection: socket.socket, server: RawServer) -> None:
    """A watched family's line that no parser takes."""
    body = b'raypulse_train_step{rank="0" 1\nraypulse_train_step{{{ \xff\xfe\n'
    server.send(connection, head(f"Content-Length: {len(body)}") + body)


def bad_chunks(connection: socket.socket, server: RawServer) -> None:
    server.send(connection, head("Transfer-Encoding: chunked") + b"zz\r\nabc\r\n0\r\n\r\n")
