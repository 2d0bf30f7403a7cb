"""`launcher submit` end to end on real local Ray clusters: a job that succeeds, one that fails and
is retried, one past its deadline, a stop, an idempotent re-submission, the Jobs API refusing a
request without the token, SIGINT/SIGTERM leaving no Ray or exporter process behind, and a
--no-wait run left on its kept cluster.

Most tests share one kept cluster (`launcher up`, tests/conftest.py's `shared_cluster`); the tests
about a cluster's whole life (start, teardown, interrupts) start their own. Run under `flock /tmp/raypulse-ray.lock`.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from exporter.contract import wire
from tests.conftest import http_get, wait_until
from tests.launcher_support import (
    SharedCluster,
    audit_actions,
    closed_by_server,
    cluster_processes,
    describe,
    free_base,
    kind,
    launcher,
    live,
    start_launcher,
    status_json,
    time_wait_ports,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

# A multi-line Python script inside single quotes: one command line (the newlines are quoted). It
# pins one task on each worker node (the scheduler may put the 20 others anywhere) and prints which
# progress URL that node's processes got.
INLINE_JOB = """echo 'import os, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init()

@ray.remote(num_cpus=1)
def square(x):
    return x * x

@ray.remote(num_cpus=1)
def where():
    labels = ray.get_runtime_context().get_node_labels()
    return labels.get("raypulse.io/node"), os.environ.get("RAYPULSE_PROGRESS_URL")

workers = [node["NodeID"] for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU")]
pinned = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
          for node in workers]
print("sum of squares", sum(ray.get([square.remote(i) for i in range(20)])))
print("progress urls", sorted(ray.get(pinned)))
print("attempt", os.environ["RAYPULSE_ATTEMPT"], "of run", os.environ["RAYPULSE_RUN_ID"])
' > job.py && python job.py"""


@pytest.fixture(scope="module")
def home(shared_launcher_home: Path) -> Path:
    return shared_launcher_home  # where the shared cluster is known


@pytest.fixture(scope="module")
def kept(shared_cluster: SharedCluster) -> dict:
    """The shared cluster (tests/conftest.py) for the tests that only need somewhere to run jobs."""
    return shared_cluster.record()


def ray_jobs(record: dict) -> list[dict]:
    """The cluster's jobs, straight from the Jobs API with the cluster's token."""
    token = Path(record["token_path"]).read_text()
    status, _, body = http_get(record["address"] + "/api/jobs/", headers={"Authorization": f"Bearer {token}"})
    assert status == 200
    return json.loads(body)


# --- a whole cluster life ----------------------------------------------------------------------


def test_job_succeeds_with_its_output_and_the_cluster_is_gone(home: Path):
    exporter_port, progress_port = free_base(3)
    result = launcher("submit", "--name", "squares", "--run-id", "squares-1", "--workers", "2",
                      "--exporter-port", str(exporter_port), "--progress-port", str(progress_port), "--label",
                      "team=infra", "--", INLINE_JOB, home=home)
    assert result.returncode == 0, result.stderr
    assert "sum of squares 2470" in result.stdout  # the job's own output, on stdout
    # Each worker node's processes report progress to their own node's exporter.
    assert (f"progress urls [('workers-1', 'http://127.0.0.1:{progress_port + 2}'), "
            f"('workers-2', 'http://127.0.0.1:{progress_port + 4}')]") in result.stdout
    assert "attempt 1 of run squares-1" in result.stdout
    assert "run squares-1 SUCCEEDED after 1 attempt (exit 0)" in result.stderr
    assert "cluster squares-1 torn down" in result.stderr
    assert not cluster_processes("squares-1"), describe(cluster_processes("squares-1"))
    assert not (home / "clusters" / "squares-1").exists()

    record = status_json("squares-1", home)
    assert (record["state"], record["exit_code"], len(record["attempts"])) == ("SUCCEEDED", 0, 1)
    assert record["attempts"][0]["running_at"] is not None
    logs = launcher("logs", "squares-1", home=home)  # kept with the run after the cluster is gone
    assert logs.returncode == 0
    assert "sum of squares 2470" in logs.stdout
    actions = [(line["action"], line["result"]) for line in audit_actions(home) if line.get("cluster") == "squares-1"
               or line.get("run_id") == "squares-1"]
    assert actions == [("cluster.up", "ok"), ("attempt.submit", "ok"), ("run.finish", "SUCCEEDED"),
                       ("cluster.down", "ok")]


def test_sigint_mid_job_stops_it_and_leaves_no_process(home: Path):
    exporter_port, progress_port = free_base(2)
    process = start_launcher("submit", "--run-id", "interrupted", "--workers", "1", "--exporter-port",
                             str(exporter_port), "--progress-port", str(progress_port), "--",
                             "python -c 'import time; print(\"training\", flush=True); time.sleep(600)'", home=home)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    wait_until(lambda: any(re.search(r"attempt 1/\d+ RUNNING", line) for line in lines) or process.poll() is not None,
               120, "the job to run")
    assert process.poll() is None, "".join(lines)
    wait_until(lambda: {"exporter", "raylet", "gcs_server"} <= {kind(p) for p in cluster_processes("interrupted")},
               30, "the exporters to start")
    by_pid = {p.pid: p for p in cluster_processes("interrupted") + psutil.Process(process.pid).children(recursive=True)}
    processes = list(by_pid.values())
    counted = {name: sum(1 for p in processes if kind(p) == name) for name in ("raylet", "exporter", "ray-start")}
    assert counted == {"raylet": 2, "exporter": 2, "ray-start": 2}, describe(processes)

    process.send_signal(signal.SIGINT)
    assert process.wait(90) == 3
    reader.join(5)
    text = "".join(lines)
    assert "stopping attempt 1 (stop requested)" in text
    assert "run interrupted STOPPED" in text
    time.sleep(0.5)
    assert not live(processes), describe(live(processes))
    assert not cluster_processes("interrupted")
    assert status_json("interrupted", home)["attempts"][0]["status"] == "STOPPED"


def test_sigterm_while_the_cluster_starts_stops_before_submitting(home: Path):
    exporter_port, progress_port = free_base(2)
    process = start_launcher("submit", "--run-id", "early-term", "--workers", "1", "--exporter-port",
                             str(exporter_port), "--progress-port", str(progress_port), "--", "sleep 600", home=home)
    wait_until(lambda: any(kind(p) == "raylet" for p in cluster_processes("early-term")), 60, "a raylet")
    processes = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGTERM)
    assert process.wait(90) == 3, process.stderr.read()
    assert "STOPPED before its job was submitted" in process.stderr.read()
    time.sleep(0.5)
    assert not live(processes), describe(live(processes))
    assert not cluster_processes("early-term")
    assert status_json("early-term", home)["attempts"] == []


def test_no_wait_leaves_a_kept_cluster_running_the_job_and_down_ends_the_run(home: Path):
    exporter_port, progress_port = free_base(2)
    result = launcher("submit", "--no-wait", "--keep-cluster", "--run-id", "left-1", "--workers", "1",
                      "--exporter-port", str(exporter_port), "--progress-port", str(progress_port), "--", "sleep 300",
                      home=home)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "left-1\n"
    assert "cluster left-1 kept at" in result.stderr
    record = status_json("left-1", home)  # the command has returned; the job has not ended
    assert record["state"] in ("PENDING", "RUNNING")
    assert (record["exit_code"], record["detached"]) == (None, True)
    # The exporters started with the cluster: no launcher is left to start them.
    head = json.loads((home / "clusters" / "left-1" / "cluster.json").read_text())["exporters"][0]["url"]
    wait_until(lambda: http_get(head + "/healthz")[0] == 200, 60, "the head exporter")
    down = launcher("down", "left-1", home=home)
    assert down.returncode == 0, down.stderr
    assert "stopped 1 unfinished job(s) first: left-1-a1" in down.stderr
    assert not cluster_processes("left-1"), describe(cluster_processes("left-1"))
    record = status_json("left-1", home)  # ended by `down`, which stopped its job while the cluster answered
    assert (record["state"], record["exit_code"]) == ("STOPPED", 3)


def test_a_second_submit_on_the_default_ports_starts_while_the_firsts_connections_are_in_time_wait(
        home: Path, tmp_path: Path):
    """Issue 35: the first run's exporter closes its connections when it stops, and their ends stay in
    TIME-WAIT on its port for 60 s; the next run binds that port as the exporter does, so it starts."""
    go = tmp_path / "go"
    first = start_launcher("submit", "--run-id", "back-1", "--workers", "1", "--",
                           f"while [ ! -e {go} ]; do sleep 0.2; done; echo ok", home=home)
    record = home / "clusters" / "back-1" / "cluster.json"

    def head() -> str:  # the record names the node's IP once Ray reports it: the exporter listens there
        return json.loads(record.read_text())["exporters"][0]["url"]

    def head_answers() -> bool:
        # An AssertionError, not an OSError: it ends the wait.
        assert first.poll() is None, f"the first run ended early: {first.stderr.read()}"
        return http_get(head() + "/healthz")[0] == 200

    try:
        wait_until(head_answers, 180, "the first run's head exporter")
        assert head().endswith(f":{wire.EXPORTER_PORT}")  # the default ports
        # A connection the exporter closes (HTTP/1.0): its end is in TIME-WAIT once the run is over.
        closed_by_server(urllib.parse.urlsplit(head()).hostname, wire.EXPORTER_PORT,
                         b"GET /healthz HTTP/1.0\r\n\r\n")
    finally:
        go.touch()  # the job ends, and the run with it (its cluster torn down), whatever happened above
        stdout, stderr = first.communicate(timeout=240)
    assert first.returncode == 0, stderr
    assert "ok" in stdout.splitlines()
    assert wire.EXPORTER_PORT in time_wait_ports(), "no TIME-WAIT left on the port: nothing to show"
    second = launcher("submit", "--run-id", "back-2", "--workers", "1", "--", "python -c \"print('ok2')\"", home=home)
    assert second.returncode == 0, second.stderr
    assert "ok2" in second.stdout.splitlines()


# --- jobs on a shared kept cluster ----------------------------------------------------------------


def test_failed_job_is_retried_and_attempts_show_in_status_and_metrics(home: Path, kept: dict):
    result = launcher("submit", "--cluster", "shared", "--name", "flaky", "--run-id", "flaky-1", "--max-retries",
                      "1", "--retry-backoff", "1", "--workspace", "research", "--label", "team=nlp", "--",
                      "echo attempt $RAYPULSE_ATTEMPT; exit 3", home=home)
    assert result.returncode == 1, result.stderr
    assert "attempt 1 failed; attempt 2 in 1s" in result.stderr
    assert "run flaky-1 FAILED after 2 attempts (exit 1)" in result.stderr
    assert "attempt 1" in result.stdout
    assert "attempt 2" in result.stdout

    record = status_json("flaky-1", home)
    assert [(a["attempt"], a["submission_id"], a["status"], a["driver_exit_code"]) for a in record["attempts"]] == [
        (1, "flaky-1-a1", "FAILED", 3), (2, "flaky-1-a2", "FAILED", 3)]
    text = launcher("status", "flaky-1", home=home).stdout
    assert re.search(r"1\s+flaky-1-a1\s+FAILED", text)
    assert re.search(r"2\s+flaky-1-a2\s+FAILED", text)
    # The cluster itself knows the attempts (status straight from it, no local record needed).
    from_cluster = status_json("flaky-1", home, "--cluster", "shared")
    assert [a["status"] for a in from_cluster["attempts"]] == ["FAILED", "FAILED"]
    # Ray job metadata, which the exporter turns into labels.
    metadata = {job["submission_id"]: job["metadata"] for job in ray_jobs(kept)
                if job["submission_id"].startswith("flaky-1")}
    assert metadata["flaky-1-a2"] == {
        "raypulse.job_name": "flaky", "raypulse.run_id": "flaky-1", "raypulse.attempt": "2",
        "raypulse.max_attempts": "2", "raypulse.workspace": "research", "raypulse.user": metadata["flaky-1-a2"][
            "raypulse.user"], "raypulse.label.team": "nlp"}
    head_exporter = kept["exporters"][0]["url"]

    def attempt_series() -> bool:
        with urllib.request.urlopen(head_exporter + "/metrics", timeout=5) as response:
            text = response.read().decode()
        return bool(re.search(r'raypulse_job_attempt\{[^}]*submission_id="flaky-1-a2"[^}]*\} 2(\.0)?\n', text))

    wait_until(attempt_series, 60, "the head exporter to show attempt 2 of flaky-1")


def test_past_active_deadline_is_stopped_exit_4(home: Path, kept: dict):
    started = time.monotonic()
    result = launcher("submit", "--cluster", "shared", "--run-id", "slow-1", "--active-deadline-seconds", "4",
                      "--", "sleep 120", home=home)
    assert result.returncode == 4, result.stderr
    assert time.monotonic() - started < 60
    assert "stopping attempt 1 (active_deadline_seconds (4s) passed)" in result.stderr
    record = status_json("slow-1", home)
    assert (record["state"], record["exit_code"]) == ("DEADLINE_EXCEEDED", 4)
    assert record["attempts"][0]["status"] == "STOPPED"


class _Stalling(BaseHTTPRequestHandler):
    """Accepts the working_dir download and answers nothing until the launcher has sent the attempt's stop
    (then it hangs up, and Ray can end the job rather than wait on the download): the attempt stays PENDING
    past its deadline. `run_file`: the run's record, where the stop shows."""

    run_file: Path

    def do_GET(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "attempt.stopping" not in self._kinds():
            time.sleep(0.2)

    def _kinds(self) -> list[str]:
        try:
            return [event["kind"] for event in json.loads(self.run_file.read_text())["events"]]
        except (OSError, ValueError, KeyError):
            return []

    def log_message(self, *args) -> None:
        pass


def test_attempt_not_running_by_pre_running_deadline_exit_4(home: Path, kept: dict):
    stalling = type("Stalling", (_Stalling,), {"run_file": home / "runs" / "stuck-1" / "run.json"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), stalling)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = launcher("submit", "--cluster", "shared", "--run-id", "stuck-1", "--pre-running-deadline-seconds",
                          "5", "--working-dir", f"http://127.0.0.1:{server.server_port}/code.zip", "--", "true",
                          home=home)
    finally:
        server.shutdown()
    assert result.returncode == 4, result.stderr
    assert "pre_running_deadline_seconds (5s) passed before the job was RUNNING" in result.stderr
    record = status_json("stuck-1", home)
    assert record["state"] == "DEADLINE_EXCEEDED"
    assert record["attempts"][0]["running_at"] is None


def test_resubmitting_a_run_id_follows_it_instead_of_running_again(home: Path, kept: dict):
    first = launcher("submit", "--cluster", "shared", "--run-id", "once-1", "--", "echo ran once", home=home)
    assert first.returncode == 0, first.stderr
    again = launcher("submit", "--cluster", "shared", "--run-id", "once-1", "--", "echo ran once", home=home)
    assert again.returncode == 0, again.stderr
    assert "already has attempt 1 (once-1-a1, SUCCEEDED); following it instead of submitting again" in again.stderr
    assert [job["submission_id"] for job in ray_jobs(kept)].count("once-1-a1") == 1
    assert not any(job["submission_id"] == "once-1-a2" for job in ray_jobs(kept))


def test_stop_command_stops_the_run_and_its_submit_exits_3(home: Path, kept: dict):
    process = start_launcher("submit", "--cluster", "shared", "--run-id", "stopme-1", "--max-retries", "2", "--",
                             "sleep 300", home=home)
    wait_until(lambda: (home / "runs" / "stopme-1" / "run.json").exists()
               and json.loads((home / "runs" / "stopme-1" / "run.json").read_text())["state"] == "RUNNING", 90,
               "the run to be RUNNING")
    result = launcher("stop", "stopme-1", home=home)
    assert result.returncode == 0, result.stderr
    assert "stopped stopme-1-a1" in result.stderr
    assert process.wait(60) == 3, process.stderr.read()
    record = status_json("stopme-1", home)
    assert (record["state"], len(record["attempts"])) == ("STOPPED", 1)  # no retry after a stop


def test_jobs_api_refuses_requests_without_the_token(home: Path, kept: dict):
    assert http_get(kept["address"] + "/api/jobs/")[0] == 401
    assert http_get(kept["address"] + "/api/jobs/", headers={"Authorization": "Bearer wrong"})[0] == 403
    refused = launcher("list", "--address", kept["address"], home=home)
    assert refused.returncode == 2
    assert "requires a Ray auth token" in refused.stderr
    listed = launcher("list", "--address", kept["address"], "--output", "json", home=home,
                      RAY_AUTH_TOKEN_PATH=kept["token_path"])
    assert listed.returncode == 0, listed.stderr
    assert "flaky-1" in {run["run_id"] for run in json.loads(listed.stdout)["runs"]}


def test_python_api_submits_and_waits(home: Path, kept: dict, monkeypatch):
    import launcher

    monkeypatch.setenv("RAYPULSE_HOME", str(home))
    with launcher.submit({"name": "api", "run_id": "api-1", "cluster": "shared",
                          "entrypoint": "python -c 'print(\"from the api\")'"}) as handle:
        assert handle.status().attempts[0].submission_id == "api-1-a1"
        record = handle.wait()
        assert (record.state, record.exit_code) == ("SUCCEEDED", launcher.ExitCode.SUCCEEDED)
        assert "from the api" in handle.logs()
    assert launcher.status("api-1").state == "SUCCEEDED"
    with pytest.raises(launcher.BadInput, match="cluster: no running local cluster named 'nope'"):
        launcher.submit({"entrypoint": "true", "cluster": "nope"})


LEAVES_AN_ACTOR = """python -c 'import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init()
@ray.remote(num_cpus=0)
class Left:
    def ready(self):
        return True
here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
ray.get(Left.options(name="left", lifetime="detached", scheduling_strategy=here).remote().ready.remote())'"""


def test_down_stops_a_running_job_first_and_its_submit_exits_3(home: Path):
    exporter_port, progress_port = free_base(2)
    result = launcher("up", "--name", "busy", "--workers", "1", "--exporter-port", str(exporter_port),
                      "--progress-port", str(progress_port), home=home)
    assert result.returncode == 0, result.stderr
    # A detached actor left on the head, as Ray Train leaves its _AutoscalingCoordinatorActor: it keeps a
    # lease, so a node that drains on SIGTERM (Ray's default) waits for it until it is killed.
    result = launcher("submit", "--cluster", "busy", "--run-id", "leaves-an-actor", "--", LEAVES_AN_ACTOR, home=home)
    assert result.returncode == 0, result.stderr
    process = start_launcher("submit", "--cluster", "busy", "--run-id", "busy-1", "--max-retries", "2", "--",
                             "sleep 300", home=home)
    run_file = home / "runs" / "busy-1" / "run.json"
    wait_until(lambda: run_file.exists() and json.loads(run_file.read_text())["state"] == "RUNNING", 90,
               "the run to be RUNNING")
    result = launcher("down", "busy", home=home)
    assert result.returncode == 0, result.stderr
    assert "stopped 1 unfinished job(s) first: busy-1-a1" in result.stderr
    # The run's launcher closed its log stream, so Ray's dashboard had nothing to wait for.
    assert "needed SIGKILL" not in result.stderr, result.stderr
    assert process.wait(60) == 3, process.stderr.read()
    record = status_json("busy-1", home)
    assert (record["state"], len(record["attempts"])) == ("STOPPED", 1)  # stopped, not retried
    assert not cluster_processes("busy"), describe(cluster_processes("busy"))


# --- a web config on the exporters, and secrets kept out of the run's records ----------------------


def test_exporters_serve_the_web_config_and_secrets_stay_out_of_the_records(home: Path, tmp_path: Path):
    import ssl

    import bcrypt
    import trustme

    from launcher.state import ExporterAccess

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(tmp_path / "server.crt"))
    server.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    hashed = bcrypt.hashpw(b"scrape-password", bcrypt.gensalt(rounds=10)).decode()
    (tmp_path / "web.yml").write_text(f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                                      f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    exporter_port, progress_port = free_base(2)
    result = launcher("submit", "--name", "tls", "--run-id", "tls-1", "--workers", "1", "--keep-cluster",
                      "--exporter-port", str(exporter_port), "--progress-port", str(progress_port),
                      "--exporter-web-config", str(tmp_path / "web.yml"), "--env", "HF_TOKEN=hf-secret-value",
                      "--", "python -c 'import sys; print(len(sys.argv))' --password pw-in-argv", home=home)
    try:
        assert result.returncode == 0, result.stderr
        directory = home / "clusters" / "tls-1"
        record = json.loads((directory / "cluster.json").read_text())
        access = ExporterAccess.model_validate(record["exporter_access"])
        assert [ref["url"].split(":")[0] for ref in record["exporters"]] == ["https", "https"]

        def answers(url: str) -> bool:
            with access.urlopen(url + "/metrics", timeout=5) as reply:
                return reply.status == 200

        for ref in record["exporters"]:
            wait_until(lambda ref=ref: answers(ref["url"]), 60, f"{ref['node']}'s exporter over TLS")
            anyone = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            anyone.check_hostname, anyone.verify_mode = False, ssl.CERT_NONE
            assert http_get(ref["url"] + "/metrics", context=anyone)[0] == 401  # no credentials: nothing
        head = next(ref["url"] for ref in record["exporters"] if ref["role"] == "head")
        with access.urlopen(head + "/sd", timeout=5) as reply:
            assert len([target for group in json.loads(reply.read()) for target in group["targets"]]) == 2
        for name in ("exporter-web-config.yml", "exporter-password", "cluster.json", "token"):
            assert (directory / name).stat().st_mode & 0o777 == 0o600, name
        assert directory.stat().st_mode & 0o777 == 0o700

        run_json = home / "runs" / "tls-1" / "run.json"
        assert run_json.stat().st_mode & 0o777 == 0o600
        for kept in (run_json, home / "audit.log"):
            assert "hf-secret-value" not in kept.read_text()
            assert "pw-in-argv" not in kept.read_text()
        assert json.loads(run_json.read_text())["spec"]["runtime_env"]["env_vars"] == {"HF_TOKEN": "<redacted>"}
    finally:
        down = launcher("down", "tls-1", home=home)
        assert down.returncode == 0, down.stderr
    assert not cluster_processes("tls-1"), describe(cluster_processes("tls-1"))
