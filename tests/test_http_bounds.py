"""What a client of the exporter's ports can hold, and what its mistakes cost: connections are capped,
idle and slow clients are dropped, scrapes at once are capped (503 beyond each bound), a malformed
request is a 4xx logged without a traceback, never a 500."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
import time
import zlib

import aiohttp
import pytest
from aiohttp import web

from exporter.config import HttpSettings
from exporter.serving.guard import EVICTABLE_AFTER_S, Guard, GuardedTCPSite
from scripts.ports import free_port
from tests.conftest import wait_until
from tests.test_web_config import basic, bcrypt_hash

SILENT_EXPORTER = ("--disable-collector", "gpu")  # the bounds do not depend on what is collected


def self_metric(running, name: str, headers: dict[str, str] | None = None, **labels: str) -> float:
    """`headers`: the scrape's (credentials)."""
    status, _, body = running.get("/metrics", headers=headers)
    assert status == 200
    selector = ",".join(f'{key}="{value}"' for key, value in labels.items())
    match = re.search(rf"^{name}{{{selector}}} (\S+)$" if selector else rf"^{name} (\S+)$", body.decode(),
                      re.MULTILINE)
    assert match, f"{name}{{{selector}}} is not exported"
    return float(match.group(1))


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_an_accept_header_prometheus_client_cannot_parse_gets_the_text_format(start_exporter):
    running = start_exporter(*SILENT_EXPORTER)
    status, headers, body = running.get("/metrics", headers={"Accept": "text/plain; version=x.y"})
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"raypulse_exporter_build_info" in body


def test_malformed_requests_are_4xx_counted_and_logged_once_without_a_traceback(start_exporter):
    running = start_exporter(*SILENT_EXPORTER)
    port = int(running.url.rsplit(":", 1)[1])
    for garbage in (b"GET /metrics HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", b"\x16\x03\x01\x00\xa5\x01\r\n\r\n",
                    b"GET /metrics HTTP/9.9\r\n\r\n"):
        with connect(port) as sock:
            sock.sendall(garbage)
            answer = sock.recv(4096)
            status_line = answer.split(b"\r\n")[0]
            assert status_line.startswith(b"HTTP/1."), answer[:100]
            assert b" 400 " in status_line, answer[:100]
    wait_until(lambda: self_metric(running, "raypulse_exporter_http_client_errors_total", kind="bad_request") >= 3,
               15, "the bad requests to be counted")
    log = running.log.read_text()
    assert "Traceback" not in log
    assert log.count("client error(s) since the last such line") == 1  # once per interval, not once per request
    assert running.get("/healthz")[0] == 200


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(30)
    try:
        while sock.recv(4096):
            pass  # what was still to read (an answer) before the end
    except ConnectionResetError:
        pass
    return True


def healthz(sock: socket.socket, close: bool = False) -> bytes:
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + (b"Connection: close\r\n" if close else b"") + b"\r\n")
    answer = b""
    while not answer.endswith(b"\r\n\r\nok\n") and b" 503 " not in answer:
        chunk = sock.recv(4096)
        if not chunk:
            break
        answer += chunk
    return answer


def test_at_the_cap_silent_then_stalled_connections_make_room_requests_in_flight_get_503s_and_bodies_have_a_deadline(
        start_exporter):
    """Issue 41, finding 2: a client that opens connections and sends `GET /metrics HTTP/1.1` and nothing
    more, or a POST's headers and never its body, held every slot (a liveness probe failed). At the cap the
    oldest silent connection makes room, then the one the longest in its headers; only requests in flight
    are never dropped, and a report's body has the idle deadline to come whole (408)."""
    progress_port = free_port()
    idle_s = 6
    running = start_exporter(*SILENT_EXPORTER, "--progress-listen", f"127.0.0.1:{progress_port}",
                             env={"RAYPULSE_EXPORTER_HTTP__MAX_CONNECTIONS": "4",
                                  "RAYPULSE_EXPORTER_HTTP__IDLE_TIMEOUT_SECONDS": str(idle_s)})
    port = int(running.url.rsplit(":", 1)[1])
    # Old enough to be evicted, far from the idle bound that would close them first: seconds from each, as the
    # exporter's loop (which times them from when it accepted or read them) may be late on a busy machine.
    halfway = (EVICTABLE_AFTER_S + idle_s) / 2
    silent = [connect(port) for _ in range(4)]  # accepted in order: these four fill the cap
    time.sleep(halfway)  # younger silent connections are never dropped (not read yet, maybe)
    with connect(port) as probe:  # the oldest silent one makes room: a health probe gets through
        assert healthz(probe, close=True).startswith(b"HTTP/1.1 200")  # and the exporter closes it
    stalled = []
    for _ in range(4):  # each newcomer takes the place of the oldest silent one
        sock = connect(port)
        assert healthz(sock).startswith(b"HTTP/1.1 200")  # answered: the exporter has heard from it
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # and it stalls in the middle of its headers
        stalled.append(sock)
    time.sleep(halfway)
    with connect(port) as probe:  # the one the longest in its headers makes room
        assert healthz(probe, close=True).startswith(b"HTTP/1.1 200")
    waiting = []
    for _ in range(4):  # whole headers, a body announced and never sent: requests in flight, each in a slot
        sock = socket.create_connection(("127.0.0.1", progress_port), timeout=10)
        sock.sendall(b"POST /v1/progress HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n")
        waiting.append(sock)
    for sock in stalled:  # each made room for a report (evicted), long before its idle bound
        assert closed_by_peer(sock)
        sock.close()
    with connect(port) as extra:  # nothing left to drop: refused
        assert healthz(extra).startswith(b"HTTP/1.1 503")
    for sock in waiting:  # the body's deadline (the idle bound): 408, and the connection closed
        sock.settimeout(30)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
        sock.close()
    for sock in silent:  # evicted
        assert closed_by_peer(sock)
        sock.close()
    assert running.get("/healthz")[0] == 200
    wait_until(lambda: self_metric(running, "raypulse_exporter_http_closed_total", reason="evicted") >= 8
               and self_metric(running, "raypulse_exporter_http_refused_total", reason="connections") >= 1, 15,
               "the evicted and refused connections to be counted")


def test_a_client_that_sends_its_header_a_byte_at_a_time_is_closed(start_exporter):
    running = start_exporter(*SILENT_EXPORTER, env={"RAYPULSE_EXPORTER_HTTP__IDLE_TIMEOUT_SECONDS": "2"})
    port = int(running.url.rsplit(":", 1)[1])
    with connect(port) as sock:
        sock.settimeout(0.5)
        closed = False
        for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:  # never a whole header
            try:
                sock.sendall(bytes([byte]))
                closed = sock.recv(1) == b""
            except TimeoutError:
                continue  # still open, as it should be until the bound
            except OSError:
                closed = True
            if closed:
                break
        assert closed, "the slow sender was never disconnected"
    wait_until(lambda: self_metric(running, "raypulse_exporter_http_closed_total", reason="idle") >= 1, 15,
               "the slow sender to be counted")


def test_a_keep_alive_connection_is_served_again_after_each_request(start_exporter):
    running = start_exporter(*SILENT_EXPORTER, env={"RAYPULSE_EXPORTER_HTTP__IDLE_TIMEOUT_SECONDS": "30"})
    port = int(running.url.rsplit(":", 1)[1])
    with connect(port) as sock:
        for _ in range(3):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b"ok\n"):
                chunk = sock.recv(4096)
                assert chunk, "closed"
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200")


async def _guarded_app(settings: HttpSettings, handler) -> tuple[web.AppRunner, Guard, int]:
    guard = Guard(settings)
    app = web.Application(middlewares=[guard.scrape_limit()])
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = GuardedTCPSite(runner, "127.0.0.1", 0, guard)
    await site.start()
    return runner, guard, runner.addresses[0][1]


def test_scrapes_over_max_requests_get_503_and_the_others_are_served():
    async def scenario() -> None:
        release = asyncio.Event()
        entered = asyncio.Event()

        async def slow_metrics(request: web.Request) -> web.Response:
            entered.set()
            await release.wait()
            return web.Response(text="ok\n")

        runner, guard, port = await _guarded_app(HttpSettings(max_requests=1), slow_metrics)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                first = asyncio.create_task(session.get(f"http://127.0.0.1:{port}/metrics"))
                await asyncio.wait_for(entered.wait(), 30)  # one scrape in flight
                async with session.get(f"http://127.0.0.1:{port}/metrics") as second:
                    assert second.status == 503
                    assert second.headers["Retry-After"] == "1"
                release.set()
                async with await first as served:
                    assert served.status == 200
            assert guard.refused["requests"] == 1
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def test_a_client_that_reads_nothing_is_disconnected_after_the_write_timeout():
    async def scenario() -> None:
        async def huge(request: web.Request) -> web.Response:
            return web.Response(body=b"x" * (64 * 1024 * 1024))

        runner, guard, port = await _guarded_app(HttpSettings(write_timeout_seconds=1), huge)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # and never read the answer
        try:
            deadline = time.monotonic() + 30
            while guard.closed["write"] == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert guard.closed["write"] == 1
            assert not guard.open
        finally:
            sock.close()
            await runner.cleanup()

    asyncio.run(scenario())


@pytest.mark.parametrize("limit", [64])
def test_the_connection_cap_never_exceeds_a_quarter_of_the_file_descriptors(limit, monkeypatch):
    import resource

    from exporter.serving import guard

    monkeypatch.setattr(guard.resource, "getrlimit", lambda which: (limit, resource.RLIM_INFINITY))
    assert guard.connection_cap(HttpSettings(max_connections=10000)) == limit // 4
    assert guard.connection_cap(HttpSettings(max_connections=8)) == 8


def exchange(port: int, request: bytes) -> bytes:
    """The whole answer to one request on its own connection (the exporter closes it after a 415)."""
    with connect(port) as sock:
        sock.sendall(request)
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
                if b"\r\n\r\n" in answer and b"Connection: close" not in answer:
                    break  # kept alive: the head says enough for these checks
        except ConnectionResetError:
            pass
        return answer


@pytest.mark.parametrize("basic_auth", [False, True], ids=["no-auth", "basic-auth"])
def test_a_compressed_request_body_gets_415_before_auth_and_no_traceback(basic_auth, tmp_path, start_exporter):
    """Issue 41, finding 3: `Content-Encoding: gzip` (or deflate) on any request was inflated by aiohttp
    before a handler or basic auth ran (CPU for anyone who can connect) and a broken one wrote an
    "Unhandled exception" traceback (200 on /metrics, 500 on the progress endpoint). Every such request
    is refused with 415 from its headers alone, with or without credentials, and nothing is traced."""
    args = [*SILENT_EXPORTER, "--progress-listen", f"127.0.0.1:{(progress_port := free_port())}"]
    if basic_auth:
        web_config = tmp_path / "web.yml"
        web_config.write_text(f"basic_auth_users:\n  prometheus: '{bcrypt_hash('s3cret')}'\n")
        args += ["--web-config", str(web_config)]
    running = start_exporter(*args, ready=False, env={"RAYPULSE_EXPORTER_PROGRESS__TOKEN": "off"})
    port = int(running.url.rsplit(":", 1)[1])
    wait_until(lambda: f"listening on {running.url} " in running.log.read_text(), 30, "the exporter to listen")
    report = json.dumps({"reports": [{"kind": "progress", "submission_id": "job-a", "rank": 0, "time": time.time(),
                                      "step": 1}]}).encode()
    bodies = {"gzip": gzip.compress(report), "deflate": zlib.compress(report), "GZip": b"not gzip at all",
              "identity, gzip": gzip.compress(report),
              "x-gzip": gzip.compress(b"\0" * (8 << 20))}  # 8 MB of zeros in 8 KB: never inflated
    targets = [(port, "GET", "/metrics"), (port, "GET", "/healthz"), (port, "POST", "/metrics"),
               (progress_port, "POST", "/v1/progress")]
    for coding, body in bodies.items():
        for target_port, method, path in targets:
            answer = exchange(target_port, f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                           f"Content-Encoding: {coding}\r\nContent-Length: {len(body)}\r\n\r\n"
                                           .encode() + body)
            assert answer.startswith(b"HTTP/1.1 415 "), (coding, method, path, answer[:200])
            assert b"\r\nAccept-Encoding: identity\r\n" in answer
    plain = exchange(progress_port, b"POST /v1/progress HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                    b"Content-Encoding: identity\r\nConnection: close\r\n"
                                    + f"Content-Length: {len(report)}\r\n\r\n".encode() + report)
    assert plain.startswith(b"HTTP/1.1 204 "), plain[:200]
    credentials = basic("prometheus", "s3cret") if basic_auth else None
    wait_until(lambda: self_metric(running, "raypulse_exporter_http_client_errors_total", headers=credentials,
                                   kind="bad_request") >= len(bodies) * len(targets), 15,
               "the refused requests to be counted")
    assert "Traceback" not in running.log.read_text()

