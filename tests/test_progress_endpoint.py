"""The progress endpoint of a real exporter process under good and bad input: clear 4xx naming
the problem, never a 5xx, bounded series per job, and a /metrics that stays valid throughout."""

from __future__ import annotations

import http.client
import json
import math
import subprocess
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import binary, free_port, http_get, wait_until
from tests.ray_testcluster import start_exporter, stop_process

MAX_JOBS, MAX_RANKS, MAX_BODY = 4, 3, 4096
FAMILIES_PER_RANK = 15  # raypulse_train_* series one rank can have at most (nonfinite counts 3 fields)


def start_progress_exporter(log_dir, **env: str):
    """An exporter (no Ray here) whose progress endpoint is at `.progress_port`; the train collector
    runs every 0.5 s (the shortest interval). `env`: more RAYPULSE_EXPORTER_* settings."""
    import os

    progress_port = free_port()
    running = start_exporter(log_dir, free_port(), "--progress-listen", f"127.0.0.1:{progress_port}", env={
        **os.environ, "RAYPULSE_EXPORTER_COLLECTORS__TRAIN__INTERVAL_SECONDS": "0.5",
        "RAYPULSE_EXPORTER_RAY__DASHBOARD_URL": f"http://127.0.0.1:{free_port()}", **env})
    running.progress_port = progress_port
    return running


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    running = start_progress_exporter(tmp_path_factory.mktemp("progress"),
                                      RAYPULSE_EXPORTER_PROGRESS__MAX_JOBS=str(MAX_JOBS),
                                      RAYPULSE_EXPORTER_PROGRESS__MAX_RANKS_PER_JOB=str(MAX_RANKS),
                                      RAYPULSE_EXPORTER_PROGRESS__MAX_BODY_BYTES=str(MAX_BODY))
    yield running
    stop_process(running.process)


def post(port: int, body: bytes, content_type: str | None = "application/json",
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        all_headers = {**({"Content-Type": content_type} if content_type else {}), **(headers or {})}
        connection.request("POST", "/v1/progress", body, all_headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def report(**fields):
    return {"kind": "progress", "submission_id": "job-a", "rank": 0, "time": time.time(), "step": 1, **fields}


def train_series(exporter) -> dict[str, list]:
    families = text_string_to_metric_families(exporter.metrics_text())
    return {f.name: f.samples for f in families if f.name.startswith("raypulse_train")}


def wait_rendered(exporter, predicate, what: str) -> dict[str, list]:
    wait_until(lambda: predicate(train_series(exporter)), 10, what)
    return train_series(exporter)


def test_a_valid_batch_is_applied_and_exported(exporter):
    status, body = post(exporter.progress_port, json.dumps({"reports": [
        report(step=7, loss="NaN", samples_total=448), report(step=8, loss=1.25, samples_total=512),
        {"kind": "checkpoint", "submission_id": "job-a", "rank": 0, "time": time.time(), "step": 8}]}).encode())
    assert (status, body) == (204, b"")

    def applied(series):
        steps = [s for s in series.get("raypulse_train_step", []) if s.labels["submission_id"] == "job-a"]
        return steps and steps[0].value == 8
    series = wait_rendered(exporter, applied, "the report in /metrics")
    labels = {"job_id": "", "submission_id": "job-a", "rank": "0"}
    assert [s.value for s in series["raypulse_train_loss"] if s.labels == labels] == [1.25]
    assert [s.value for s in series["raypulse_train_nonfinite_values"]
            if s.labels == {**labels, "field": "loss"} and s.name.endswith("_total")] == [1]
    assert [s.value for s in series["raypulse_train_samples"] if s.labels == labels and s.name.endswith("_total")] \
        == [512]
    assert [s.value for s in series["raypulse_train_checkpoint_step"] if s.labels == labels] == [8]


@pytest.mark.parametrize(("body", "content_type", "status", "message"), [
    (b"{not json", "application/json", 400, "body: not valid JSON"),
    (json.dumps({"reports": [report(rank=-1)]}).encode(), "application/json", 400, "reports[0].rank"),
    (json.dumps({"reports": [report(extra=1)]}).encode(), "application/json", 400, "reports[0].extra: unknown field"),
    (json.dumps({"reports": [report()]}).encode(), "text/plain", 415, "Content-Type must be application/json"),
    (json.dumps({"reports": [report()]}).encode(), None, 415, "Content-Type must be application/json"),
    (b"[" * 2000 + b"]" * 2000, "application/json", 400, "body"),  # deep nesting, under the size limit
    (json.dumps({"reports": [report(step=n) for n in range(200)]}).encode(), "application/json", 413,
     "progress.max_body_bytes"),
])
def test_bad_requests_get_a_clear_4xx(exporter, body, content_type, status, message):
    got, reply = post(exporter.progress_port, body, content_type)
    assert got == status, reply
    assert message in json.loads(reply)["error"]


def test_a_chunked_body_over_the_limit_is_cut_off(exporter):
    connection = http.client.HTTPConnection("127.0.0.1", exporter.progress_port, timeout=10)
    chunks = (b" " * 1024 for _ in range(64))  # 64 KiB of whitespace, no Content-Length
    connection.request("POST", "/v1/progress", chunks, {"Content-Type": "application/json"},
                       encode_chunked=True)
    response = connection.getresponse()
    assert response.status == 413
    connection.close()


def test_other_methods_and_paths_are_refused(exporter):
    assert http_get(f"http://127.0.0.1:{exporter.progress_port}/v1/progress")[0] == 405
    assert post(exporter.progress_port, b"{}", headers={})[0] in (400,)
    connection = http.client.HTTPConnection("127.0.0.1", exporter.progress_port, timeout=10)
    connection.request("POST", "/metrics", b"{}", {"Content-Type": "application/json"})
    assert connection.getresponse().status == 404
    connection.close()


# -- fuzzing -----------------------------------------------------------------------------------

_ids = st.one_of(st.none(), st.sampled_from(["02000000", "03000000", "0a", "zz", ""]), st.text(max_size=70))
_submissions = st.one_of(st.none(), st.sampled_from([f"run-{i}" for i in range(8)]), st.text(max_size=140))
_numbers = st.one_of(st.none(), st.integers(-(2**64), 2**64), st.floats(allow_nan=False, allow_infinity=False),
                     st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "1.5", ""]), st.booleans())
_reports = st.fixed_dictionaries(
    {"kind": st.sampled_from(["progress", "checkpoint", "rl", "other"])},
    optional={"job_id": _ids, "submission_id": _submissions, "rank": st.one_of(st.integers(-2, 8), _numbers),
              "time": st.one_of(st.just("now"), _numbers), "step": _numbers, "loss": _numbers,
              "grad_norm": _numbers, "learning_rate": _numbers, "samples_total": _numbers,
              "tokens_total": _numbers, "dropped_total": _numbers, "surprise": st.text(max_size=5),
              "iteration": _numbers, "kl": _numbers, "truncated_ratio": _numbers,
              "phases": st.dictionaries(st.text(max_size=45), st.dictionaries(
                  st.sampled_from(["seconds_total", "iteration_seconds", "running_since", "x"]), _numbers),
                  max_size=18),
              "rewards": st.dictionaries(st.text(max_size=45), _numbers, max_size=18)})
_valid_reports = st.fixed_dictionaries(  # well-formed, so the bounds (jobs, ranks) are exercised too
    {"kind": st.sampled_from(["progress", "checkpoint", "rl"]), "rank": st.integers(0, 5), "time": st.just("now"),
     "submission_id": st.sampled_from([f"run-{i}" for i in range(8)])},
    optional={"step": st.integers(0, 2**40), "loss": st.floats(), "grad_norm": st.floats(),
              "samples_total": st.integers(0, 2**40), "job_id": st.sampled_from(["02000000", "03000000"])})
_valid_rl_reports = st.fixed_dictionaries(
    {"kind": st.just("rl"), "rank": st.integers(0, 5), "time": st.just("now"),
     "submission_id": st.sampled_from([f"run-{i}" for i in range(8)])},
    optional={"iteration": st.integers(0, 2**40), "kl": st.floats(), "truncated_ratio": st.floats(0, 1),
              "phases": st.dictionaries(st.sampled_from(["generate", "train", "weight_sync"]), st.fixed_dictionaries(
                  {"seconds_total": st.floats(0, 1e9)}, optional={"running_since": st.just("now")}), max_size=3),
              "rewards": st.dictionaries(st.sampled_from(["format", "judge"]), st.floats(-10, 10), max_size=2)})
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=4), max_leaves=20)


def _encode(value) -> bytes:
    def now(item):
        if isinstance(item, dict):
            return {k: (time.time() if v == "now" else now(v)) for k, v in item.items()}
        if isinstance(item, list):
            return [now(v) for v in item]
        return item
    return json.dumps(now(value)).encode()  # Python's json writes NaN/Infinity literals, as some clients do


_bodies = st.one_of(
    st.lists(_reports, min_size=1, max_size=12).map(lambda rs: _encode({"reports": rs})),
    st.lists(_valid_reports, min_size=1, max_size=12).map(lambda rs: _encode({"reports": rs})),
    st.lists(_valid_rl_reports, min_size=1, max_size=12).map(lambda rs: _encode({"reports": rs})),
    _json.map(_encode),
    st.binary(max_size=600),
    st.integers(3000, 8000).map(lambda n: b'{"reports": [' + b" " * n + b"]}"))  # around the size limit


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(body=_bodies, content_type=st.sampled_from(["application/json", "application/json; charset=utf-8",
                                                   "text/plain", None]))
def test_fuzzed_requests_never_get_a_5xx(exporter, body, content_type):
    status, reply = post(exporter.progress_port, body, content_type)
    assert status in (204, 400, 413, 415, 429), (status, reply)
    if status != 204:
        error = json.loads(reply)["error"]
        assert isinstance(error, str)
        assert error


def test_after_the_fuzzing_the_exporter_is_healthy_bounded_and_valid(exporter):
    assert exporter.process.poll() is None
    assert exporter.get("/healthz")[0] == 200
    text = exporter.metrics_text()
    result = subprocess.run([binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    series = train_series(exporter)
    jobs = {(s.labels["job_id"], s.labels["submission_id"]) for s in series.get("raypulse_train_ranks", [])}
    assert 1 <= len(jobs) <= MAX_JOBS
    assert all(s.value <= MAX_RANKS for s in series["raypulse_train_ranks"])
    per_rank = sum(len(v) for k, v in series.items() if k not in (
        "raypulse_train_ranks", "raypulse_train_endpoint_up", "raypulse_train_jobs", "raypulse_train_rejected_reports",
        "raypulse_train_series", "raypulse_train_series_limit", "raypulse_train_refused_series"))
    assert per_rank <= MAX_JOBS * MAX_RANKS * FAMILIES_PER_RANK * 2  # counters render _total and _created
    rejected = {s.labels["reason"]: s.value for s in series["raypulse_train_rejected_reports"]
                if s.name.endswith("_total")}
    assert all(rejected[reason] > 0 for reason in ("invalid", "unsupported_media_type", "too_large")), rejected
    assert rejected["too_many_jobs"] + rejected["too_many_ranks"] > 0, rejected  # the bounds were reached
    assert not any(math.isnan(s.value) for samples in series.values() for s in samples)


def test_the_unix_socket_is_removed_at_shutdown(tmp_path):
    import os

    socket_path = tmp_path / "progress.sock"
    running = start_exporter(tmp_path, free_port(), "--progress-listen", f"unix:{socket_path}",
                             env={**os.environ, "RAYPULSE_EXPORTER_RAY__DASHBOARD_URL": f"http://127.0.0.1:{free_port()}"})
    assert socket_path.is_socket()
    stop_process(running.process)
    assert running.process.returncode == 0
    assert not socket_path.exists()
