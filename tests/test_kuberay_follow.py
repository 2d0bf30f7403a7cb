"""`launcher submit --backend kuberay` follows the RayJob like any run: against our fake API server with
KubeRay's state machine (tests/fake_kube.py), through the real kubernetes client and the real CLI. The
driver's log streams, the run ends on KubeRay's deployment status with the launcher's exit codes, a
retry is a second attempt in the journal, a watch the server closes is opened again, ValidationFailed
ends as bad input without hanging, and Ctrl-C or `launcher stop` deletes the RayJob (suspends it under
Kueue); `status` and `list` know the run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from launcher.backends.kuberay.follow import LOG_NOTE_S, LOG_POLL_MAX_S, POLL_S
from tests.conftest import REPO, wait_until
from tests.fake_kube import VALIDATION_FAILED, Attempt, FakeApiServer, launcher_env, launching

pytest.importorskip("kubernetes")

NAMESPACE = "team-a"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def api_server(ca: trustme.CA) -> Iterator[FakeApiServer]:
    with FakeApiServer(ca, watch_close_s=0.3) as server:  # watches end often: each is opened again
        yield server


@pytest.fixture
def env(tmp_path: Path, ca: trustme.CA, api_server: FakeApiServer) -> dict[str, str]:
    return launcher_env(tmp_path, ca, api_server, NAMESPACE)


def launcher(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=timeout)


def submit(env: dict[str, str], run_id: str, *flags: str) -> subprocess.CompletedProcess:
    return launcher(env, "submit", "--backend", "kuberay", "--run-id", run_id, *flags, "--", "python train.py")


def submitting(env: dict[str, str], run_id: str, *flags: str) -> subprocess.Popen:
    """`launcher submit` of a RayJob, left running (its output piped) for the test to act on."""
    return launching(env, "submit", "--backend", "kuberay", "--run-id", run_id, *flags, "--", "python train.py")


def record(env: dict[str, str], run_id: str) -> dict:
    result = launcher(env, "status", run_id, "-o", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_run_streams_the_drivers_log_and_exits_0(env: dict[str, str], api_server: FakeApiServer):
    lines = [f"step {step} loss {1 / step:.3f}" for step in range(1, 21)]  # longer than a watch lasts
    api_server.scripts["ok-1"] = [Attempt("SUCCEEDED", lines)]
    result = submit(env, "ok-1")
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if line.startswith("step ")] == lines  # each line once
    assert "run ok-1: RayJob ok-1 in namespace team-a" in result.stderr
    assert api_server.watches >= 2  # the server closed the watch; it was opened again
    run = record(env, "ok-1")
    assert (run["state"], run["exit_code"], len(run["attempts"])) == ("SUCCEEDED", 0, 1)
    assert run["attempts"][0]["submission_id"] == api_server.rayjob(NAMESPACE, "ok-1")["status"]["jobId"]
    saved = launcher(env, "logs", "ok-1")
    assert saved.returncode == 0, saved.stderr
    assert saved.stdout.splitlines() == lines
    listed = launcher(env, "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert any(row["run_id"] == "ok-1" and row["state"] == "SUCCEEDED" for row in json.loads(listed.stdout)["runs"])


def test_a_watch_too_old_to_resume_starts_from_a_fresh_list(env: dict[str, str], api_server: FakeApiServer):
    """After a compaction the RayJob's own resourceVersion is too old to watch from (410 Gone, for good):
    the follower lists it again and watches from the list's version, and still sees the stop."""
    api_server.scripts["gone-1"] = [Attempt("HOLD", ["waiting"])]
    process = submitting(env, "gone-1")
    try:
        wait_until(lambda: _running(env, "gone-1"), 60, "the RayJob to run")
        api_server.compact(NAMESPACE)
        watches = api_server.watches
        wait_until(lambda: api_server.watches >= watches + 2, 60, "the follower to watch again")
        assert api_server.expired == 1  # one 410, then it watches from the list's version, not the object's
        assert launcher(env, "stop", "gone-1").returncode == 0
        assert process.wait(60) == 3, process.stderr.read()
    finally:
        process.kill()
    assert api_server.rayjob(NAMESPACE, "gone-1") is None


def test_a_retried_run_is_followed_through_its_retries(env: dict[str, str], api_server: FakeApiServer):
    api_server.scripts["retry-1"] = [Attempt("FAILED", ["first try"], until_followed=True),
                                     Attempt("SUCCEEDED", ["second try"])]
    result = submit(env, "retry-1", "--max-retries", "1")
    assert result.returncode == 0, result.stderr
    assert "first try\nsecond try\n" in result.stdout
    run = record(env, "retry-1")
    assert [attempt["status"] for attempt in run["attempts"]] == ["FAILED", "SUCCEEDED"]
    assert len({attempt["submission_id"] for attempt in run["attempts"]}) == 2  # a new jobId each
    assert "retry.scheduled" in [event["kind"] for event in run["events"]]
    assert launcher(env, "logs", "retry-1", "--attempt", "1").stdout == "first try\n"


def test_a_given_submission_id_is_kept_across_kuberays_retries(env: dict[str, str], api_server: FakeApiServer):
    """KubeRay reuses spec.jobId (from --submission-id) on every retry: the attempts still come apart."""
    # The first attempt runs until it is followed, as a real one would (a CI run's launcher, late on a busy
    # machine, first saw the RayJob when KubeRay's fake had already retried it).
    api_server.scripts["kept-1"] = [Attempt("FAILED", ["first try"], until_followed=True),
                                    Attempt("SUCCEEDED", ["second try"])]
    result = submit(env, "kept-1", "--max-retries", "1", "--submission-id", "raysubmit_kept")
    assert result.returncode == 0, result.stderr
    run = record(env, "kept-1")
    assert [(attempt["attempt"], attempt["status"], attempt["submission_id"]) for attempt in run["attempts"]] == [
        (1, "FAILED", "raysubmit_kept"), (2, "SUCCEEDED", "raysubmit_kept")]


def test_a_failed_rayjob_exits_1_naming_kuberays_reason(env: dict[str, str], api_server: FakeApiServer):
    api_server.scripts["fail-1"] = [Attempt("FAILED", ["Traceback: boom"])]
    result = submit(env, "fail-1", "--max-retries", "0")
    assert result.returncode == 1, result.stderr
    run = record(env, "fail-1")
    assert (run["state"], run["exit_code"]) == ("FAILED", 1)
    assert "KubeRay: Failed (AppFailed)" in run["reason"]


def test_kuberays_deadline_exits_4_though_the_job_status_stays_running(env: dict[str, str],
                                                                        api_server: FakeApiServer):
    api_server.scripts["late-1"] = [Attempt("DEADLINE", ["working"])]
    result = submit(env, "late-1", "--active-deadline-seconds", "60")
    assert result.returncode == 4, result.stderr
    run = record(env, "late-1")
    assert run["state"] == "DEADLINE_EXCEEDED"
    assert "DeadlineExceeded" in run["reason"]


def test_validation_failed_is_bad_input_and_does_not_hang(env: dict[str, str], api_server: FakeApiServer):
    api_server.scripts["bad-1"] = VALIDATION_FAILED
    result = submit(env, "bad-1")
    assert result.returncode == 2, result.stderr
    assert "KubeRay refused RayJob bad-1 (ValidationFailed: invalid RayJob spec" in result.stderr
    assert "Traceback" not in result.stderr
    assert api_server.rayjob(NAMESPACE, "bad-1") is None  # it never ran: deleted, so a fixed spec can go in


def _running(env: dict[str, str], run_id: str) -> bool:
    result = launcher(env, "status", run_id, "-o", "json")
    return result.returncode == 0 and json.loads(result.stdout)["state"] == "RUNNING"


@pytest.mark.parametrize("how", ["ctrl-c", "launcher stop"])
def test_a_stop_deletes_the_rayjob_and_exits_3(env: dict[str, str], api_server: FakeApiServer, how: str):
    api_server.scripts["hold-1"] = [Attempt("HOLD", ["waiting"])]
    process = submitting(env, "hold-1")
    try:
        wait_until(lambda: _running(env, "hold-1"), 60, "the RayJob to run")
        if how == "ctrl-c":
            process.send_signal(signal.SIGINT)
        else:
            assert launcher(env, "stop", "hold-1").returncode == 0
        assert process.wait(60) == 3, process.stderr.read()
    finally:
        process.kill()
    assert api_server.rayjob(NAMESPACE, "hold-1") is None
    run = record(env, "hold-1")
    assert (run["state"], run["attempts"][0]["status"]) == ("STOPPED", "STOPPED")


def test_under_kueue_a_stop_suspends_the_rayjob(env: dict[str, str], api_server: FakeApiServer):
    api_server.scripts["queued-1"] = [Attempt("HOLD", ["waiting"])]
    process = submitting(env, "queued-1", "--queue", "team-nlp")
    try:  # Kueue's webhook suspended it: the launcher waits while it is queued, and follows it once admitted
        wait_until(lambda: (api_server.rayjob(NAMESPACE, "queued-1") or {}).get("status", {}).get(
            "jobDeploymentStatus") == "Suspended", 60, "Kueue to hold the RayJob")
        assert process.poll() is None
        assert record(env, "queued-1")["exit_code"] is None
        api_server.admit(NAMESPACE, "queued-1")
        wait_until(lambda: _running(env, "queued-1"), 60, "the RayJob to run")
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 3, process.stderr.read()
    finally:
        process.kill()
    rayjob = api_server.rayjob(NAMESPACE, "queued-1")
    assert (rayjob["spec"]["suspend"], rayjob["status"]["jobDeploymentStatus"]) == (True, "Suspended")
    assert record(env, "queued-1")["state"] == "STOPPED"


def _seen(env: dict[str, str], run_id: str) -> bool:
    result = launcher(env, "status", run_id, "-o", "json")
    return result.returncode == 0 and bool(json.loads(result.stdout)["attempts"])


def _suspended(api_server: FakeApiServer, name: str) -> bool:
    return (api_server.rayjob(NAMESPACE, name) or {}).get("status", {}).get("jobDeploymentStatus") == "Suspended"


def test_under_kueue_the_queue_and_a_preemption_are_not_failures(env: dict[str, str], api_server: FakeApiServer):
    """KubeRay names a queued RayJob's attempt at Initializing and Kueue's suspend resets that jobId: nothing ran,
    nothing failed. A preemption (Kueue suspends the running RayJob) ends the attempt as preempted, not failed, and
    the run follows the next one once Kueue admits the RayJob again: neither is a failure, a retry or a spent
    retry (max_retries 0)."""
    api_server.scripts["kq-1"] = [Attempt("HOLD", ["first"]), Attempt("SUCCEEDED", ["second"])]
    process = submitting(env, "kq-1", "--queue", "team-nlp", "--max-retries", "0")
    try:
        wait_until(lambda: _suspended(api_server, "kq-1"), 60, "Kueue to hold the RayJob")
        api_server.admit(NAMESPACE, "kq-1")
        wait_until(lambda: _running(env, "kq-1"), 60, "the RayJob to run")
        api_server.preempt(NAMESPACE, "kq-1")
        wait_until(lambda: _suspended(api_server, "kq-1"), 60, "Kueue to preempt the RayJob")
        api_server.admit(NAMESPACE, "kq-1")
        assert process.wait(60) == 0, process.stderr.read()
    finally:
        process.kill()
    run = record(env, "kq-1")
    assert [(item["attempt"], item["status"]) for item in run["attempts"]] == [(1, "STOPPED"), (2, "SUCCEEDED")]
    assert run["attempts"][1]["submission_id"] == api_server.rayjob(NAMESPACE, "kq-1")["status"]["jobId"]
    kinds = [event["kind"] for event in run["events"]]
    assert (kinds.count("attempt.preempted"), "retry.scheduled" in kinds) == (1, False)
    assert launcher(env, "logs", "kq-1", "--attempt", "2").stdout == "second\n"


def _looks_around(seconds: float) -> tuple[float, float]:
    """When the log follower looks for a submitter pod (POLL_S doubling up to LOG_POLL_MAX_S, from when it saw
    the attempt run): the first look past `seconds`, and the one after it."""
    at, wait = 0.0, POLL_S
    while at <= seconds:
        at, wait = at + wait, min(wait * 2, LOG_POLL_MAX_S)
    return at, at + wait


def test_a_submitter_pod_that_comes_late_is_followed_through_an_outage(env: dict[str, str],
                                                                       api_server: FakeApiServer):
    """The submitter pod waits for a node while the attempt is Running, and the API server blinks meanwhile:
    the log follower says once that the log is not there yet and keeps looking; the driver's output is
    streamed and saved whole (never an empty attempt log that hides the pod's)."""
    # The follower says so at its first look past LOG_NOTE_S (7.5 s after it saw the attempt run): the pod comes
    # halfway to the next look (15.5 s), seconds from each, however late the follower saw the attempt (a pod at
    # 8 s left half a second: in one CI run, the note's look found it).
    said, found = _looks_around(LOG_NOTE_S)
    api_server.scripts["late-1"] = [Attempt("SUCCEEDED", ["step 1", "step 2"], until_followed=True,
                                            pod_after_s=(said + found) / 2)]
    process = submitting(env, "late-1")
    try:
        wait_until(lambda: _seen(env, "late-1"), 60, "the attempt to be seen")
        api_server.outage(3.0)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert [line for line in out.splitlines() if line.startswith("step ")] == ["step 1", "step 2"]
    assert err.count("the driver's log of attempt 1 is not available yet") == 1
    assert launcher(env, "logs", "late-1").stdout == "step 1\nstep 2\n"


def test_no_wait_records_the_run_and_status_catches_up(env: dict[str, str], api_server: FakeApiServer):
    """--no-wait: the run is recorded at once; `status` reads the RayJob (nothing else follows it) and
    finishes the record when KubeRay has ended it."""
    api_server.scripts["later-1"] = [Attempt("SUCCEEDED", ["done"])]
    result = submit(env, "later-1", "--no-wait")
    assert result.returncode == 0, result.stderr
    assert any(row["run_id"] == "later-1" for row in json.loads(launcher(env, "list", "-o", "json").stdout)["runs"])
    wait_until(lambda: record(env, "later-1")["state"] == "SUCCEEDED", 60, "status to see KubeRay's end")
    run = record(env, "later-1")
    assert (run["exit_code"], [attempt["status"] for attempt in run["attempts"]]) == (0, ["SUCCEEDED"])
    assert launcher(env, "logs", "later-1").stdout == "done\n"  # the submitter pod's, as KubeRay kept it


def test_stop_of_a_run_nothing_follows_deletes_the_rayjob(env: dict[str, str], api_server: FakeApiServer):
    api_server.scripts["left-1"] = [Attempt("HOLD", ["waiting"])]
    assert submit(env, "left-1", "--no-wait").returncode == 0
    wait_until(lambda: _running(env, "left-1"), 60, "the RayJob to run")
    wait_until(lambda: launcher(env, "logs", "left-1").stdout == "waiting\n", 60, "the running attempt's log")
    stopped = launcher(env, "stop", "left-1")
    assert stopped.returncode == 0, stopped.stderr
    assert api_server.rayjob(NAMESPACE, "left-1") is None
    run = record(env, "left-1")
    assert (run["state"], run["exit_code"]) == ("STOPPED", 3)


def test_a_second_submit_of_a_followed_run_is_refused(env: dict[str, str], api_server: FakeApiServer):
    api_server.scripts["twice-1"] = [Attempt("HOLD", ["waiting"])]
    process = submitting(env, "twice-1")
    try:
        wait_until(lambda: _running(env, "twice-1"), 60, "the RayJob to run")
        again = submit(env, "twice-1")
        assert again.returncode == 2
        assert "supervised by a launcher that is still running" in again.stderr
        assert launcher(env, "stop", "twice-1").returncode == 0
        assert process.wait(60) == 3, process.stderr.read()
    finally:
        process.kill()


def test_report_and_export_of_a_kuberay_run_do_not_crash(env: dict[str, str], api_server: FakeApiServer,
                                                         tmp_path: Path):
    api_server.scripts["rep-1"] = [Attempt("SUCCEEDED", ["done"])]
    assert submit(env, "rep-1", "--no-sidecar").returncode == 0
    report = launcher(env, "report", "rep-1", "--out", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    exported = launcher(env, "export", "rep-1", "--out", str(tmp_path / "r.om"))
    assert exported.returncode == 2  # no sidecar, nothing recorded: said in one line, not a traceback
    assert "has no recording" in exported.stderr
    assert "KubeRay" in exported.stderr
    assert exported.stderr.count("\n") == 1


def test_a_run_left_with_no_wait_is_followed_again_by_its_run_id(env: dict[str, str], api_server: FakeApiServer):
    api_server.scripts["again-1"] = [Attempt("FAILED", ["first try"]), Attempt("SUCCEEDED", ["second try"])]
    assert submit(env, "again-1", "--no-wait", "--max-retries", "1").returncode == 0
    result = submit(env, "again-1", "--max-retries", "1")  # the RayJob is found (409), not applied twice
    assert result.returncode == 0, result.stderr
    assert "following the one applied before" in result.stderr
    run = record(env, "again-1")
    assert (run["state"], run["exit_code"], run["detached"]) == ("SUCCEEDED", 0, False)


def test_an_api_server_outage_shorter_than_the_loss_limit_leaves_the_run_followed(env: dict[str, str],
                                                                                   api_server: FakeApiServer):
    """The API server fails every call for a few seconds while the RayJob trains on, unchanged. Once it
    answers again the run is followed as before: a watch opened again from a known version is quiet while
    nothing changes, which is no sign of a lost server (it ended such runs as lost, exit 5, once the loss
    limit passed). The run then stops as asked."""
    from launcher.run import LOST_AFTER_S

    api_server.scripts["blip-1"] = [Attempt("HOLD", ["training"])]
    process = submitting(env, "blip-1")
    try:
        wait_until(lambda: _running(env, "blip-1"), 60, "the RayJob to run")
        api_server.outage(3)
        wait_until(lambda: api_server.refused > 0, 30, "the follower to meet the outage")
        began = time.monotonic()
        while time.monotonic() - began < LOST_AFTER_S + 5:  # past the loss limit, the RayJob unchanged all along
            assert process.poll() is None, process.stderr.read()
            time.sleep(0.5)
        assert launcher(env, "stop", "blip-1").returncode == 0
        assert process.wait(60) == 3, process.stderr.read()
    finally:
        process.kill()
    run = record(env, "blip-1")
    assert (run["state"], run["exit_code"]) == ("STOPPED", 3)


def test_a_stop_asked_during_an_outage_is_carried_out_once_the_server_answers(env: dict[str, str],
                                                                             api_server: FakeApiServer):
    """The delete that a stop needs meets 503s: it is asked again (the server's trouble, not the request's)
    until the server answers, within the loss limit; the run then stops as asked, not as bad input."""
    api_server.scripts["stop-blip-1"] = [Attempt("HOLD", ["training"])]
    process = submitting(env, "stop-blip-1")
    try:
        wait_until(lambda: _running(env, "stop-blip-1"), 60, "the RayJob to run")
        api_server.outage(6)
        assert launcher(env, "stop", "stop-blip-1").returncode == 0  # the request is the run's own file
        wait_until(lambda: any(method == "DELETE" for method, _, _ in api_server.requests[-50:]) or
                   not api_server.down, 30, "the follower to ask for the delete")
        assert process.wait(90) == 3, process.stderr.read()
    finally:
        process.kill()
    assert api_server.rayjob(NAMESPACE, "stop-blip-1") is None
    assert record(env, "stop-blip-1")["state"] == "STOPPED"


def _deletes(api_server: FakeApiServer, name: str) -> int:
    return sum(1 for method, path, _ in list(api_server.requests) if method == "DELETE" and path.endswith(f"/{name}"))


def test_a_stop_while_the_server_throttles_waits_as_it_says_and_a_conflict_is_asked_again(
        env: dict[str, str], api_server: FakeApiServer):
    """429 with Retry-After (API Priority and Fairness): the delete a stop needs is asked again no sooner than
    the server says; a 409 Conflict (the object moved) is asked again too, not taken for bad input."""
    api_server.scripts["throttled-1"] = [Attempt("HOLD", ["training"])]
    process = submitting(env, "throttled-1")
    try:
        wait_until(lambda: _running(env, "throttled-1"), 60, "the RayJob to run")
        api_server.throttle(6, retry_after=3)
        assert launcher(env, "stop", "throttled-1").returncode == 0
        assert process.wait(90) == 3, process.stderr.read()
    finally:
        process.kill()
    assert api_server.throttled > 0
    # Within 6 s of 429s, at most one ask at the start and one after each 3 s Retry-After, then the one that
    # succeeds (the follower's own pace, 0.5 s, would have asked ~12 times).
    assert 1 <= _deletes(api_server, "throttled-1") <= 4
    assert record(env, "throttled-1")["state"] == "STOPPED"

    api_server.scripts["conflict-1"] = [Attempt("HOLD", ["training"])]
    process = submitting(env, "conflict-1")
    try:
        wait_until(lambda: _running(env, "conflict-1"), 60, "the RayJob to run")
        api_server.conflicts = 2
        assert launcher(env, "stop", "conflict-1").returncode == 0
        assert process.wait(90) == 3, process.stderr.read()
    finally:
        process.kill()
    assert _deletes(api_server, "conflict-1") == 3  # two 409s, then the delete
    assert api_server.rayjob(NAMESPACE, "conflict-1") is None


def test_the_servers_trouble_is_infrastructure_and_the_requests_fault_is_bad_input():
    """As Kubernetes clients classify a failed call: 429, 5xx and lost connections are the server's (retried,
    then the run is lost: exit 5); any other 4xx is the request's, with its fix (exit 2)."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import ProtocolError

    from launcher.backends.kuberay.access import KubeAccess, api_error, transient
    from launcher.errors import BadInput, InfraError

    access = KubeAccess(api_client=None, namespace="team-a", server="https://k8s.example:6443", context="team")

    def failed(status: int, reason: str) -> ApiException:
        return ApiException(status=status, reason=reason)

    for server_side in (failed(500, "Internal Server Error"), failed(503, "Service Unavailable"),
                        failed(429, "Too Many Requests")):
        assert transient(server_side)
        assert isinstance(api_error(server_side, access, "delete rayjobs", "team-a"), InfraError)
    assert transient(ProtocolError("Connection aborted."))
    conflict = ApiException(status=409, reason="Conflict")
    conflict.body = json.dumps({"kind": "Status", "reason": "Conflict", "code": 409})
    assert transient(conflict)  # the object moved under the change: asked again (client-go's RetryOnConflict)
    exists = ApiException(status=409, reason="Conflict")
    exists.body = json.dumps({"kind": "Status", "reason": "AlreadyExists", "code": 409})
    assert not transient(exists)
    for own in (failed(403, "Forbidden"), failed(422, "Unprocessable Entity"), failed(400, "Bad Request")):
        assert not transient(own)
        assert isinstance(api_error(own, access, "create rayjobs", "team-a"), BadInput)
