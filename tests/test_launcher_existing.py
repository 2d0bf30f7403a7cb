"""`launcher --address`: submission to a running Ray cluster (token auth on) through the Jobs API only; the
same cluster named by RAY_ADDRESS, and a run submitted with --no-wait followed afterwards; and the checks
made before submitting (token, Ray version).

The cluster is the suite's shared one (tests/conftest.py's `shared_cluster`), reached by its dashboard's
address and token alone, from homes that do not know it: to the launcher it is any cluster. One that
someone else started with plain `ray start` (no raypulse labels, no exporters of ours) takes runs through
`--address` in tests/test_launcher_deploy.py. Run under `flock /tmp/raypulse-ray.lock`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import http_get, wait_until
from tests.launcher_support import SharedCluster, launcher, start_launcher, status_json

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@dataclass
class ExistingCluster:
    address: str
    token: str
    token_path: Path


@pytest.fixture(scope="module")
def cluster(shared_cluster: SharedCluster) -> ExistingCluster:
    """The shared cluster as a client elsewhere knows it: its dashboard's address and its token."""
    record = shared_cluster.record()
    token_path = Path(record["token_path"])
    return ExistingCluster(record["address"], token_path.read_text().strip(), token_path)


def test_submit_to_an_existing_cluster(cluster: ExistingCluster, tmp_path: Path):
    result = launcher("submit", "--address", cluster.address, "--token-path", str(cluster.token_path),
                      "--run-id", "remote-1", "--name", "remote", "--", "python -c 'print(6 * 7)'", home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "42" in result.stdout
    assert "run remote-1 SUCCEEDED after 1 attempt (exit 0)" in result.stderr
    # Status, logs and list go through the same Jobs API (token from the environment this time).
    record = status_json("remote-1", tmp_path, "--address", cluster.address, RAY_AUTH_TOKEN=cluster.token)
    assert (record["state"], record["attempts"][0]["submission_id"]) == ("SUCCEEDED", "remote-1-a1")
    logs = launcher("logs", "remote-1", "--address", cluster.address, home=tmp_path, RAY_AUTH_TOKEN=cluster.token)
    assert logs.returncode == 0
    assert "42" in logs.stdout
    listed = launcher("list", "--address", cluster.address, "-o", "json", home=tmp_path, RAY_AUTH_TOKEN=cluster.token)
    assert "remote-1" in {run["run_id"] for run in json.loads(listed.stdout)["runs"]}


def test_stop_through_the_jobs_api(cluster: ExistingCluster, tmp_path: Path):
    submit = subprocess.Popen([sys.executable, "-m", "launcher", "submit", "--address", cluster.address,
                               "--run-id", "remote-stop", "--", "sleep 300"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "RAYPULSE_HOME": str(tmp_path / "submitter"),
                                   "RAY_AUTH_TOKEN": cluster.token})
    wait_until(lambda: submit.poll() is not None or launcher(
        "status", "remote-stop", "--address", cluster.address, "-o", "json", home=tmp_path,
        RAY_AUTH_TOKEN=cluster.token).stdout.count('"RUNNING"') > 0, 90, "the job to run")
    # Another machine (another RAYPULSE_HOME) stops it by run id through the cluster.
    stopped = launcher("stop", "remote-stop", "--address", cluster.address, home=tmp_path,
                       RAY_AUTH_TOKEN=cluster.token)
    assert stopped.returncode == 0, stopped.stderr
    assert submit.wait(60) == 3, submit.stderr.read()


def test_ray_address_names_the_existing_cluster_as_for_ray_job_submit(cluster: ExistingCluster, tmp_path: Path):
    result = launcher("submit", "--run-id", "from-env", "--", "python -c 'print(6 * 7)'", home=tmp_path,
                      RAY_ADDRESS=cluster.address, RAY_AUTH_TOKEN=cluster.token)
    assert result.returncode == 0, result.stderr
    assert f"RAY_ADDRESS is {cluster.address}: submitting to that existing Ray cluster" in result.stderr
    assert "42" in result.stdout
    assert not (tmp_path / "clusters").exists()  # no local cluster was started
    record = status_json("from-env", tmp_path, RAY_AUTH_TOKEN=cluster.token)
    assert (record["backend"], record["address"], record["state"]) == ("existing", cluster.address, "SUCCEEDED")
    # RAY_API_SERVER_ADDRESS comes first (RAY_ADDRESS, here what ray.init would take, is not read then).
    result = launcher("submit", "--run-id", "from-api-env", "--", "true", home=tmp_path, RAY_ADDRESS="127.0.0.1:6379",
                      RAY_API_SERVER_ADDRESS=cluster.address, RAY_AUTH_TOKEN=cluster.token)
    assert result.returncode == 0, result.stderr
    assert f"RAY_API_SERVER_ADDRESS is {cluster.address}" in result.stderr


def test_no_wait_returns_while_the_job_runs_and_the_run_stays_followable(cluster: ExistingCluster, tmp_path: Path):
    job = "python -c 'import time; print(\"started\", flush=True); time.sleep(300)'"
    result = launcher("submit", "--no-wait", "--address", cluster.address, "--token-path", str(cluster.token_path),
                      "--run-id", "detached-1", "--", job, home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "detached-1\n"  # the run id alone: RUN=$(launcher submit --no-wait ...)
    assert "not followed from here (--no-wait)" in result.stderr
    # The command has returned; the job has not ended. Later commands need no token flag: the record
    # names the token file the run was submitted with.
    record = status_json("detached-1", tmp_path)
    assert record["state"] in ("PENDING", "RUNNING")
    assert record["exit_code"] is None
    assert (record["detached"], record["max_attempts"], record["pid"]) == (True, 1, None)
    assert "submitted with --no-wait" in launcher("status", "detached-1", home=tmp_path).stdout
    wait_until(lambda: "started" in launcher("logs", "detached-1", home=tmp_path).stdout, 90, "the job's output")
    follower = start_launcher("logs", "--follow", "detached-1", home=tmp_path)
    try:
        stopped = launcher("stop", "detached-1", home=tmp_path)
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped detached-1-a1" in stopped.stderr
        out, err = follower.communicate(timeout=90)  # the stream ends with the job
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert "started" in out
    wait_until(lambda: status_json("detached-1", tmp_path)["state"] == "STOPPED", 60, "the run to end STOPPED")
    record = status_json("detached-1", tmp_path)
    assert (record["exit_code"], [a["status"] for a in record["attempts"]]) == (3, ["STOPPED"])
    assert "started" in (tmp_path / "runs" / "detached-1" / "attempt-1.log").read_text()  # kept with the run


def test_without_the_token_nothing_is_submitted(cluster: ExistingCluster, tmp_path: Path):
    assert http_get(cluster.address + "/api/jobs/")[0] == 401  # the Jobs API itself refuses
    result = launcher("submit", "--address", cluster.address, "--run-id", "no-token", "--", "true", home=tmp_path)
    assert result.returncode == 2
    assert "token: the cluster at" in result.stderr
    assert "requires a Ray auth token" in result.stderr
    wrong = launcher("submit", "--address", cluster.address, "--run-id", "no-token", "--", "true", home=tmp_path,
                     RAY_AUTH_TOKEN="not-the-token")
    assert wrong.returncode == 2
    assert "refused the token" in wrong.stderr
    jobs = json.loads(http_get(cluster.address + "/api/jobs/",
                               headers={"Authorization": f"Bearer {cluster.token}"})[2])
    assert not any(job["submission_id"].startswith("no-token") for job in jobs)


class _OldRay(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"version": "4", "ray_version": "2.5.1"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_a_cluster_older_than_ray_2_6_is_refused(tmp_path: Path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OldRay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = launcher("submit", "--address", f"http://127.0.0.1:{server.server_port}", "--", "true",
                          home=tmp_path)
    finally:
        server.shutdown()
    assert result.returncode == 2
    assert "runs Ray 2.5.1; the launcher needs Ray >= 2.6" in result.stderr
