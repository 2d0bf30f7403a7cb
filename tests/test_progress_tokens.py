"""Where Ray token authentication is on, the progress endpoint takes a job's progress only with that
job's token: another local process cannot write its step and loss, nor fill the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from exporter.contract import wire
from tests.conftest import REPO, wait_until
from tests.ray_testcluster import stop_process
from tests.test_progress_endpoint import post, start_progress_exporter, train_series

RAY_TOKEN = "a" * 64


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    running = start_progress_exporter(tmp_path_factory.mktemp("tokens"), RAY_AUTH_TOKEN=RAY_TOKEN)
    yield running
    stop_process(running.process)


def batch(submission_id: str, step: int = 1) -> bytes:
    return json.dumps({"reports": [{"kind": "progress", "submission_id": submission_id, "rank": 0,
                                    "time": time.time(), "step": step}]}).encode()


def bearer(owner_kind: str, owner_id: str, key: str = RAY_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {wire.progress_token(key, owner_kind, owner_id)}"}


@pytest.mark.parametrize(("headers", "message"), [
    ({}, "a token is required"),
    ({"Authorization": "Basic dXNlcjpwYXNz"}, "a token is required"),
    (bearer("submission", "job-b"), "not the one of submission job-a"),  # another job's token
    (bearer("job", "job-a"), "not the one of submission job-a"),  # the right id under another kind
    (bearer("submission", "job-a", key="b" * 64), "not the one of submission job-a"),  # not this cluster's
])
def test_reports_without_their_jobs_token_are_refused(exporter, headers, message):
    status, body = post(exporter.progress_port, batch("job-a"), headers=headers)
    assert status == 401
    assert message in json.loads(body)["error"]


def test_a_job_reports_with_its_token_and_the_refusals_are_counted(exporter):
    assert post(exporter.progress_port, batch("job-a", step=7), headers=bearer("submission", "job-a"))[0] == 204
    wait_until(lambda: any(s.value == 7 for s in train_series(exporter).get("raypulse_train_step", [])), 10,
               "the step of job-a")
    steps = train_series(exporter)["raypulse_train_step"]
    assert [(s.labels["submission_id"], s.value) for s in steps] == [("job-a", 7)]
    rejected = {s.labels["reason"]: s.value for s in train_series(exporter)["raypulse_train_rejected_reports"]
                if s.name.endswith("_total")}
    assert rejected["unauthorized"] >= 5


def test_the_client_sends_the_token_the_launcher_gave_its_attempt(exporter, tmp_path):
    code = ("import json\nfrom exporter import progress\nprogress.report(3, loss=0.5)\nprogress.flush(5)\n"
            "print(json.dumps(progress.stats()))")

    def run(extra: dict[str, str]) -> dict:
        env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
        env |= {wire.ENV_PROGRESS_URL: f"http://127.0.0.1:{exporter.progress_port}",
                wire.ENV_SUBMISSION_ID: "job-c", "HOME": str(tmp_path), **extra}
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    given = wire.progress_token(RAY_TOKEN, "submission", "job-c")
    assert run({wire.ENV_PROGRESS_TOKEN: given})["sent"] == 1
    assert run({"RAY_AUTH_TOKEN": RAY_TOKEN})["sent"] == 1  # derived from the Ray token it can read
    assert run({})["rejected"] == 1  # neither: refused, counted, training goes on


# --- the second probe (issue 29): findings 1, 5 and 6 ----------------------------------------------


def test_a_non_ascii_token_is_refused_like_any_wrong_one(exporter):
    for value in (b"Bearer \xc3\xa9", b"Bearer \xff\xfe", "Bearer é".encode()):  # UTF-8, not UTF-8 at all
        status, body = post(exporter.progress_port, batch("job-a"), headers={"Authorization": value})
        assert status == 401, body
        assert "not the one of submission job-a" in json.loads(body)["error"]
    assert "Traceback" not in exporter.log.read_text()  # counted with the other refusals, not logged as a bug


def test_a_jobs_token_does_not_let_it_report_under_another_jobs_id(exporter):
    forged = {"reports": [{"kind": "progress", "submission_id": "job-d", "job_id": "0b000000", "rank": 0,
                           "time": time.time(), "step": 5}]}
    status, _ = post(exporter.progress_port, json.dumps(forged).encode(), headers=bearer("submission", "job-d"))
    assert status == 204  # job-d's own progress is taken; the Ray job id comes from Ray, not from the report
    wait_until(lambda: any(s.labels["submission_id"] == "job-d"
                           for s in train_series(exporter).get("raypulse_train_step", [])), 10, "job-d's step")
    labelled = {s.labels["job_id"] for samples in train_series(exporter).values() for s in samples
                if "job_id" in s.labels}
    assert "0b000000" not in labelled


def test_a_token_file_that_disappears_refuses_reports_instead_of_turning_tokens_off(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(RAY_TOKEN)
    running = start_progress_exporter(tmp_path, RAY_AUTH_TOKEN_PATH=str(token_file), HOME=str(tmp_path))
    try:
        port = running.progress_port
        assert post(port, batch("job-e"))[0] == 401
        token_file.rename(tmp_path / "token.x")
        status, body = post(port, batch("job-e"))
        assert status == 401, body  # was 204: the check was off while the file was gone
        assert "cannot read the Ray auth token" in json.loads(body)["error"]
        assert post(port, batch("job-e"), headers=bearer("submission", "job-e"))[0] == 401  # nothing to check with
        (tmp_path / "token.x").rename(token_file)
        assert post(port, batch("job-e"), headers=bearer("submission", "job-e"))[0] == 204
    finally:
        stop_process(running.process)


def test_a_ray_token_once_seen_and_then_gone_refuses_reports(tmp_path):
    home_token = tmp_path / ".ray" / "auth_token"  # where Ray looks without RAY_AUTH_TOKEN(_PATH): optional
    home_token.parent.mkdir()
    home_token.write_text(RAY_TOKEN)
    running = start_progress_exporter(tmp_path, HOME=str(tmp_path))
    try:
        port = running.progress_port
        assert post(port, batch("job-f"), headers=bearer("submission", "job-f"))[0] == 204
        home_token.unlink()
        status, body = post(port, batch("job-f"))
        assert status == 401, body
        assert "no longer" in json.loads(body)["error"]
    finally:
        stop_process(running.process)
