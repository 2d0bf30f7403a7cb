"""The launcher's one Prometheus HTTP API client (launcher/promql.py), as reports and the health watcher
use it: bounded like every read of foreign input (size, deadline, no redirect), strictly parsed, and
credentials in the URL sent as basic auth but never shown. The servers are real sockets on loopback
(tests/broken_exporters.py) answering the way a broken or hostile endpoint does.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from launcher.promql import Prometheus, PrometheusError
from tests.broken_exporters import RawServer, gzip_bomb, head, trickle_headers

VECTOR = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"__name__": "up", "instance": "10.0.0.5:9477"}, "value": [1700000000.5, "1"]},
    {"metric": {"instance": "10.0.0.6:9477"}, "value": [1700000000.5, "NaN"]}]}}


def answering(body: bytes, *headers: str, status: str = "200 OK") -> Any:
    def answer(connection: socket.socket, server: RawServer) -> None:
        server.send(connection, head(*headers, f"Content-Length: {len(body)}", status=status) + body)
    return answer


@pytest.fixture
def api() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A real HTTP server that answers every query with VECTOR and keeps each request's headers."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers))
            body = json.dumps(VECTOR).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}", seen
    server.shutdown()


def test_an_instant_query_gives_its_samples_parsed(api):
    address, _ = api
    first, second = Prometheus(f"http://{address}").query("up")
    assert first.metric == {"__name__": "up", "instance": "10.0.0.5:9477"}
    assert first.value == (1700000000.5, 1.0)
    assert second.value[1] != second.value[1]  # NaN, as Prometheus writes it


def test_credentials_in_the_url_go_as_basic_auth_and_are_never_shown(api):
    address, seen = api
    prometheus = Prometheus(f"http://reader:s3cret@{address}/")
    prometheus.query("up")
    assert seen[-1]["Authorization"] == "Basic cmVhZGVyOnMzY3JldA=="  # reader:s3cret
    assert "s3cret" not in prometheus.shown
    assert "s3cret" not in repr(vars(prometheus))
    with RawServer(answering(b"{}", status="500 Internal Server Error")) as broken, \
            pytest.raises(PrometheusError) as error:
        Prometheus(f"http://reader:s3cret@{broken.address}").query("up")
    assert "s3cret" not in str(error.value)
    assert broken.address in str(error.value)


@pytest.mark.parametrize(("answer", "why"), [
    (answering(b"", "Location: http://elsewhere:9090/api/v1/query", status="302 Found"),
     "HTTP 302 Found (redirects are not followed"),
    (answering(b"x" * 2048), "an answer of 2048 bytes, more than the 1024 read"),
    (gzip_bomb(2**24), "more than"),
    (answering(b"<html>login</html>"), "not an HTTP API answer"),
    (answering(json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {}, "value": [1, "not a number"]}]}}).encode()), "not an HTTP API answer"),
    (answering(json.dumps({**VECTOR, "extra": 1}).encode()), "not an HTTP API answer (extra"),
    (answering(json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}).encode()),
     "bad_data: parse error"),
    (answering(json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}).encode()),
     "not an HTTP API answer"),
], ids=["redirect", "oversize", "gzip-bomb", "not-json", "not-a-number", "unknown-field", "api-error", "scalar"])
def test_an_answer_past_the_bounds_or_not_the_apis_shape_is_refused_with_why(answer, why):
    with RawServer(answer) as server:
        prometheus = Prometheus(server.url, max_wire_bytes=1024, max_inflated_bytes=2**20)
        with pytest.raises(PrometheusError) as error:
            prometheus.query("up")
    assert str(error.value).startswith(f"Prometheus {server.url}: ")
    assert why in str(error.value)


def test_an_answer_that_trickles_ends_at_the_deadline():
    with RawServer(trickle_headers) as server, pytest.raises(PrometheusError, match=r"no whole answer within 0\.5s"):
        Prometheus(server.url).query("up", timeout=0.5)


def test_a_url_that_is_not_prometheus_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="prometheus: 'ftp://prom:9090' is not a Prometheus URL"):
        Prometheus("ftp://prom:9090")
