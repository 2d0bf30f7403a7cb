"""The launcher against a Ray dashboard that misbehaves (issue 41, findings 1, 4, 6 and 10): every call to
the dashboard has a deadline for its whole answer and a size cap, a redirect is never followed, a
`launcher submit` whose dashboard stops answering still ends on SIGTERM as a stop (exit 3) with its
record final, every answer is parsed strictly (one line, exit 2 or 5, never a traceback; one forged job
breaks no listing), and what the launcher prints of a cluster's text reaches the terminal escaped.

The dashboard is a fake (`FakeDashboard`) of the routes Ray 2.x serves for the Jobs API and that the
launcher calls (ray/dashboard/modules/job/job_head.py: GET /api/version, GET /api/jobs/, POST /api/jobs/,
GET /api/jobs/{submission_id}, POST /api/jobs/{submission_id}/stop; the bodies as Ray's JobDetails and
version reply have them), with a mode per route that makes it hang, drip a byte at a time, answer more
than the cap, or redirect elsewhere.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from exporter.contract import wire
from launcher import jobs, raydash
from launcher.jobs import ClusterLost, JobsClient
from launcher.raydash import RedirectRefused
from tests.conftest import REPO, wait_until
from tests.launcher_support import launcher


class FakeDashboard(ThreadingHTTPServer):
    """`mode[route]` ("version": GET /api/version, "info": GET /api/jobs/<id>, "submit": POST /api/jobs/):
    "ok", "hang" (headers never sent), "drip" (headers, then a byte every 0.2 s), "huge" (a body over
    `huge_bytes`), "redirect" (307 to `redirect_to`). The info mode applies from the `info_ok`-th read of a
    job on (before, it answers); a job nobody submitted is a 404, as Ray's. `answers[route]` ("version",
    "info", "list": GET /api/jobs/) is a body given whole, JSON or not, instead of Ray's; `jobs` are the
    rows of GET /api/jobs/ (Ray's JobDetails, or whatever a test puts there). `requests` lists (method,
    path) as they came."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode: dict[str, str] = {"version": "ok", "info": "ok", "submit": "ok"}
        self.answers: dict[str, bytes] = {}
        self.jobs: list[Any] = []
        self.requests: list[tuple[str, str]] = []
        self.huge_bytes = 2 * 2**20
        self.submitted: set[str] = set()
        self.info_ok = 0  # reads of a job answered before its mode applies
        self.info_reads = 0
        self.redirect_to = ""
        self.released = threading.Event()  # ends every hang and drip (the test's end)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> FakeDashboard:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that cut its read short (the deadline, the cap) is what these tests ask for

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: FakeDashboard
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.server.requests.append(("GET", self.path))
        if self.path.startswith("/api/version"):
            return self._as(self.server.mode["version"], {"ray_version": "2.40.0", "version": "4",
                                                          "ray_commit": "x", "session_name": "s"}, "version")
        if self.path.rstrip("/") == "/api/jobs":
            return self._as("ok", self.server.jobs, "list")
        if self.path.startswith("/api/jobs/"):
            sid = self.path.split("/")[3]
            if sid not in self.server.submitted:
                return self._json({"error": f"Job {sid} does not exist"}, 404)
            self.server.info_reads += 1
            mode = self.server.mode["info"] if self.server.info_reads > self.server.info_ok else "ok"
            return self._as(mode, _details(sid), "info")
        return self._json({"error": "not here"}, 404)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        self.server.requests.append(("POST", self.path))
        if self.path.rstrip("/") == "/api/jobs":
            if self.server.mode["submit"] == "ok":
                self.server.submitted.add(body.get("submission_id"))
            return self._as(self.server.mode["submit"], {"submission_id": body.get("submission_id"), "job_id": None})
        if self.path.endswith("/stop"):
            return self._json({"stopped": True})
        return self._json({"error": "not here"}, 404)

    def _as(self, mode: str, body: Any, route: str = "") -> None:
        if mode == "hang":
            self.server.released.wait(120)
            return
        if mode == "redirect":
            self.send_response(307)
            self.send_header("Location", self.server.redirect_to + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if mode == "drip":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            while not self.server.released.wait(0.2):
                self.wfile.write(b" ")
                self.wfile.flush()
            return
        if mode == "huge":
            text = json.dumps({**body, "message": "x" * self.server.huge_bytes}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")  # no Content-Length to refuse it by
            self.end_headers()
            for start in range(0, len(text), 65536):
                piece = text[start:start + 65536]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        self._json(body, raw=self.server.answers.get(route))

    def _json(self, body: Any, status: int = 200, raw: bytes | None = None) -> None:
        text = json.dumps(body).encode() if raw is None else raw
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args: object) -> None:
        pass


def _details(sid: str) -> dict[str, Any]:
    return {"type": "SUBMISSION", "job_id": None, "submission_id": sid, "driver_info": None, "status": "RUNNING",
            "entrypoint": "python train.py", "message": "Job is currently running.", "error_type": None,
            "start_time": int(time.time() * 1000), "end_time": None, "metadata": {}, "runtime_env": {},
            "driver_agent_http_address": None, "driver_node_id": None, "driver_exit_code": None}


@pytest.fixture
def dashboard() -> Iterator[FakeDashboard]:
    with FakeDashboard() as running:
        yield running


@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(jobs, "REQUEST_TIMEOUT_S", 1.0)
    return 1.0


@pytest.mark.parametrize("mode", ["hang", "drip"])
def test_a_status_read_that_never_ends_is_cut_at_its_deadline(dashboard: FakeDashboard, short_deadline: float,
                                                              mode: str):
    client = JobsClient(dashboard.url, None)
    dashboard.mode["info"] = mode
    dashboard.submitted.add("raysubmit_1")
    with pytest.raises(ClusterLost, match=f"no whole answer within {short_deadline:g}s|timed out"):
        client.details("raysubmit_1")


def test_an_answer_over_the_cap_is_refused_unread(dashboard: FakeDashboard, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(raydash, "MAX_ANSWER_BYTES", 2**20)
    client = JobsClient(dashboard.url, None)
    dashboard.mode["info"] = "huge"
    dashboard.submitted.add("raysubmit_1")
    with pytest.raises(ClusterLost, match=f"more than {2**20} bytes"):
        client.details("raysubmit_1")


def test_a_redirect_is_refused_and_nothing_reaches_where_it_points(dashboard: FakeDashboard):
    with FakeDashboard() as elsewhere:
        dashboard.redirect_to = elsewhere.url
        client = JobsClient(dashboard.url, "the-token", headers={"X-Api-Key": "SECRET"})
        dashboard.mode["submit"] = "redirect"
        with pytest.raises(RedirectRefused, match="307"):
            client.submit("raysubmit_1", "python train.py", {"env_vars": {"DB_PASSWORD": "hunter2"}}, {})
        dashboard.mode["info"] = "redirect"
        dashboard.submitted.add("raysubmit_1")
        with pytest.raises(ClusterLost, match="redirect is not followed"):
            client.details("raysubmit_1")
        assert elsewhere.requests == []


def test_sigterm_ends_a_run_whose_dashboard_stopped_answering_as_a_stop(dashboard: FakeDashboard, tmp_path: Path):
    """The dashboard accepted the job and answered two status reads, then never answers about it: SIGTERM
    still ends the run as a stop, exit 3, with the job asked to stop and the record final."""
    env = {"RAYPULSE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    dashboard.mode["info"], dashboard.info_ok = "hang", 2
    process = subprocess.Popen([sys.executable, "-m", "launcher", "submit", "--address", dashboard.url, "--run-id",
                                "silent-1", "--no-health", "--", "python train.py"], cwd=REPO, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: dashboard.info_reads > dashboard.info_ok, 60, "a status read that hangs")
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 3, process.stderr.read()
    finally:
        process.kill()
    status = subprocess.run([sys.executable, "-m", "launcher", "status", "silent-1", "-o", "json"], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "STOPPED"
    [sid] = dashboard.submitted
    assert ("POST", f"/api/jobs/{sid}/stop") in dashboard.requests


# --- what a dashboard answers, read strictly (issue 41, findings 6 and 10) ------------------------------------


def launcher_lines(*args: str, home: Path) -> tuple[int, list[str], list[str]]:
    """(exit code, stdout lines, stderr lines) of a real `launcher` process; never a traceback."""
    result = launcher(*args, home=home)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout.splitlines(), result.stderr.splitlines()


def launched(sid: str, run_id: str, attempt: str = "1", **fields: Any) -> dict[str, Any]:
    """A job row as the launcher submits it (its raypulse.* metadata, as launcher/run.py writes it)."""
    metadata = {wire.META_RUN_ID: run_id, wire.META_JOB_NAME: run_id, wire.META_ATTEMPT: attempt,
                wire.META_MAX_ATTEMPTS: "1"}
    return {**_details(sid), "metadata": metadata, **fields}


@pytest.mark.parametrize("body", [b"[]", b'{"ray_version": 2}', b"null", b"[" * 200_000, b'{"ray_version": "two"}',
                                  b"\xff\xfe", b'{"ray_version": "2.' + b"4" * 100 + b'"}', b"<html>Login</html>"],
                         ids=["list", "number", "null", "nested", "not-a-version", "not-utf8", "long", "html"])
def test_an_api_version_answer_that_names_no_ray_version_is_a_bad_target(dashboard: FakeDashboard, tmp_path: Path,
                                                                          body: bytes):
    """The probe saw TypeError, InvalidVersion and RecursionError tracebacks, exit 1."""
    dashboard.answers["version"] = body
    code, _, err = launcher_lines("list", "--address", dashboard.url, home=tmp_path)
    assert code == 2
    assert err == [f"launcher: address: {dashboard.url}/api/version did not name a Ray version (a JSON object with "
                   "ray_version, as Ray's dashboard answers); is this a Ray dashboard?"]


def test_a_version_answer_that_drips_ends_at_the_reads_deadline(dashboard: FakeDashboard,
                                                                monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(raydash, "READ_TIMEOUT_S", 1.0)
    dashboard.mode["version"] = "drip"
    with pytest.raises(jobs.TargetError, match=r"cannot reach the Ray dashboard .*no whole answer within 1s"):
        JobsClient(dashboard.url, None)


def test_a_version_answer_over_the_cap_is_refused(dashboard: FakeDashboard, monkeypatch: pytest.MonkeyPatch):
    """The probe's 800 MB /api/version cost 1.6 GB and the run went on."""
    monkeypatch.setattr(raydash, "MAX_ANSWER_BYTES", 2**20)
    dashboard.mode["version"] = "huge"
    with pytest.raises(jobs.TargetError, match=f"more than {2**20} bytes"):
        JobsClient(dashboard.url, None)


@pytest.mark.parametrize("body", [b"[1, 2]", json.dumps({**_details("raysubmit_1"), "status": "EXPLODED"}).encode(),
                                  b"{}", b"[" * 200_000, b"not json"],
                         ids=["list", "unknown-status", "empty", "nested", "not-json"])
def test_job_details_not_in_rays_form_are_a_lost_read_in_one_line(dashboard: FakeDashboard, body: bytes):
    """Pydantic tracebacks before; now what the follow loop counts against the loss limit (exit 5 past it)."""
    client = JobsClient(dashboard.url, None)
    dashboard.submitted.add("raysubmit_1")
    dashboard.answers["info"] = body
    with pytest.raises(ClusterLost, match="answered a job's details in a form Ray's does not have") as lost:
        client.details("raysubmit_1")
    assert "\n" not in str(lost.value)


def test_a_job_list_not_in_rays_form_is_a_lost_cluster(dashboard: FakeDashboard, tmp_path: Path):
    dashboard.answers["list"] = b'{"jobs": "elsewhere"}'
    code, _, err = launcher_lines("list", "--address", dashboard.url, home=tmp_path)
    assert code == 5
    assert err == [f"launcher: list: the Jobs API at {dashboard.url} answered the list of jobs in a form Ray's does "
                   "not have (TypeError); is this a Ray dashboard?"]


def test_one_job_with_forged_launcher_metadata_does_not_break_the_listing(dashboard: FakeDashboard, tmp_path: Path):
    """Anyone can submit a job with `raypulse.attempt: "NaN"` (`ray job submit --metadata-json`): it crashed
    `launcher list --address` for everyone. Such a job is listed as a job of its own (by its submission id),
    and a row that is not a job at all is left out."""
    dashboard.jobs = [launched("good-run-a1", "good-run", status="SUCCEEDED"),
                      launched("raysubmit_forged", "good-run", attempt="NaN"),
                      launched("raysubmit_huge", "good-run", attempt="1e309"),
                      {**_details("raysubmit_odd"), "status": "EXPLODED"}, [1, 2], "row"]
    code, out, _ = launcher_lines("list", "--address", dashboard.url, home=tmp_path)
    assert code == 0
    assert {line.split()[0]: line.split()[1] for line in out[1:]} == {
        "good-run": "SUCCEEDED", "raysubmit_forged": "RUNNING", "raysubmit_huge": "RUNNING"}
    code, out, _ = launcher_lines("status", "good-run", "--address", dashboard.url, home=tmp_path)
    assert code == 0
    assert "attempts  1 of 1" in out


def test_cluster_text_reaches_the_terminal_escaped(dashboard: FakeDashboard, tmp_path: Path):
    """Issue 41, finding 10: a job's message (Ray puts the driver's log tail there) carried an OSC title
    sequence and BEL to the terminal, and run ids from job metadata forged rows of `launcher list`."""
    message = "\x1b]0;pwned\x07Job failed \x9b2J\rgone\nsecond line"
    forged_sid = "raysubmit_x\n\x1b[2Jforged-run                         SUCCEEDED"
    dashboard.jobs = [launched("esc-run-a1", "esc-run", status="FAILED", message=message),
                      launched(forged_sid, "evil\nrow")]
    code, out, _ = launcher_lines("status", "esc-run", "--address", dashboard.url, home=tmp_path)
    assert code == 0
    shown = "\n".join(out)
    assert not set(shown) & {"\x1b", "\x07", "\x9b", "\r"}
    assert "\\x1b]0;pwned\\x07Job failed \\x9b2J\\rgone" in shown
    assert "second line" not in shown  # the rest of Ray's message is the log's tail, kept with the run
    code, out, _ = launcher_lines("list", "--address", dashboard.url, home=tmp_path)
    assert code == 0
    assert len(out) == 3  # the header and two runs: no forged row
    assert "\x1b" not in "".join(out)
    assert out[2].startswith("raysubmit_x\\n\\x1b[2Jforged-run ")
