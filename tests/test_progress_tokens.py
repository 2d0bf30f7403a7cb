"""Where Ray token authentication is on, the progress endpoint takes a job's progress only with that
job's token: another local process cannot write its step and loss, nor fill the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from exporter import wire
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
