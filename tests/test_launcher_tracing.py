"""The launcher's OTLP traces: one trace per `launcher submit`, spans for the cluster, each attempt
and its phases, the backoff and the teardown, sent to a real OTLP/HTTP receiver; the trace id in
the audit log, the run record, the Ray job metadata and the job's TRACEPARENT; and a hanging
endpoint that costs a bounded few seconds and never the job.

The two end-to-end tests run on local Ray clusters (the retried run on one of its own, whose start and
teardown it traces; the hanging endpoint's on tests/conftest.py's shared cluster): run under
`flock /tmp/raypulse-ray.lock`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from launcher import audit
from launcher.run import job_metadata, runtime_env
from launcher.spec import JobSpec, SpecError, build_spec
from launcher.tracing import FLUSH_TIMEOUT_S, AttemptSpan, RunTrace, traces_url
from tests.conftest import free_port
from tests.launcher_support import SharedCluster, audit_actions, free_base, launcher, status_json
from tests.otlp_receiver import OtlpReceiver

HEX32 = re.compile(r"^[0-9a-f]{32}$")


def received_spans(receiver: OtlpReceiver) -> list[dict[str, Any]]:
    """Every span received, flattened: name, ids as hex, attributes, status, resource."""
    spans = []
    for request in receiver.traces:
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attributes = {}
                    for item in span.attributes:
                        value = item.value
                        attributes[item.key] = getattr(value, value.WhichOneof("value"))
                    spans.append({"name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                                  "parent": span.parent_span_id.hex() or None, "attributes": attributes,
                                  "error": span.status.code == span.status.STATUS_CODE_ERROR,
                                  "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                                  "resource": resource})
    return spans


def children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted((span for span in spans if span["parent"] == parent["span_id"]), key=lambda span: span["start"])


# --- without a cluster -------------------------------------------------------------------------------


def test_endpoint_from_the_spec_then_the_standard_variables():
    assert traces_url("http://collector:4318", {}) == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/v1/traces", {}) == "http://collector:4318/v1/traces"
    assert traces_url(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == "http://c:4318/v1/traces"
    assert traces_url(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/traces"}) == "http://t:4318/traces"
    assert traces_url("http://spec:4318", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318"}).startswith("http://spec")
    assert traces_url(None, {}) is None
    assert traces_url("http://collector:4318", {"OTEL_SDK_DISABLED": "true"}) is None


def test_otlp_endpoint_is_a_url_and_not_for_kuberay():
    assert build_spec({"entrypoint": "true", "otlp_endpoint": "http://c:4318"}).otlp_endpoint == "http://c:4318"
    with pytest.raises(SpecError, match="otlp_endpoint: 'collector:4318' is not an OTLP/HTTP URL"):
        build_spec({"entrypoint": "true", "otlp_endpoint": "collector:4318"})
    with pytest.raises(SpecError, match="otlp_endpoint: applies to backend local or existing only"):
        build_spec({"entrypoint": "true", "otlp_endpoint": "http://c:4318", "backend": "kuberay"})


def test_without_an_endpoint_nothing_is_traced_and_the_sdk_is_not_loaded():
    code = """
import sys
from launcher import api
from launcher.tracing import RunTrace, current_trace_id
run_trace = RunTrace(None, {"raypulse.run_id": "r"})
with run_trace.current(), run_trace.span("cluster.start"):
    assert current_trace_id() is None
run_trace.finish("SUCCEEDED")
assert run_trace.trace_id is None
loaded = [name for name in sys.modules if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))]
assert not loaded, loaded
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    spec = JobSpec(name="plain", entrypoint="true", run_id="plain-1")
    assert "raypulse.trace_id" not in job_metadata(spec, 1)
    assert "TRACEPARENT" not in runtime_env(spec, 1)["env_vars"]


def test_audit_lines_inside_a_traced_run_carry_its_trace_id(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    receiver = OtlpReceiver().start()
    run_trace = RunTrace(traces_url(receiver.url, {}), {"raypulse.run_id": "r"})
    with run_trace.current():
        audit.record("attempt.submit", "ok", run_id="r")
    audit.record("cluster.down", "ok", cluster="other")
    run_trace.finish("SUCCEEDED")
    inside, outside = audit.read()
    assert HEX32.match(run_trace.trace_id)
    assert inside["trace_id"] == run_trace.trace_id
    assert "trace_id" not in outside
    [root] = received_spans(receiver)
    assert (root["name"], root["trace_id"], root["error"]) == ("launcher.run", run_trace.trace_id, False)


@pytest.mark.parametrize("endpoint", ["hanging", "down"])
def test_a_bad_endpoint_costs_at_most_the_flush_timeout(endpoint: str):
    url = OtlpReceiver(mode="hang").start().url if endpoint == "hanging" else f"http://127.0.0.1:{free_port()}"
    warnings: list[str] = []
    run_trace = RunTrace(url + "/v1/traces", warn=warnings.append)
    with run_trace.current():
        for number in range(1, 50):
            AttemptSpan(run_trace, "r", number, f"r-a{number}").end("FAILED")
    started = time.monotonic()
    run_trace.finish("FAILED")
    assert time.monotonic() - started < FLUSH_TIMEOUT_S + 2  # bounded (an unbounded flush would take minutes)
    assert len(warnings) == 1
    assert warnings[0].startswith(f"the run's trace did not all reach {url}/v1/traces")


# --- a real `launcher submit` on a local cluster -------------------------------------------------------

# Attempt 1 fails, attempt 2 succeeds; each prints what it got from the launcher: TRACEPARENT and,
# through Ray's job config, the raypulse.trace_id of its own job metadata.
RETRIED_JOB = ("echo traceparent=$TRACEPARENT && python -c \"import json, os; print('metadata trace_id=' + "
               "json.loads(os.environ['RAY_JOB_CONFIG_JSON_ENV_VAR'])['metadata']['raypulse.trace_id'])\" "
               "&& sleep 4 && test $RAYPULSE_ATTEMPT = 2")  # long enough for the launcher's polls to see it RUNNING


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_retried_run_is_one_trace_with_its_attempts(tmp_path: Path):
    receiver = OtlpReceiver().start()
    exporter_port, progress_port = free_base(2)
    result = launcher("submit", "--name", "traced", "--run-id", "traced-1", "--max-retries", "1", "--retry-backoff",
                      "1", "--exporter-port", str(exporter_port), "--progress-port", str(progress_port),
                      "--otlp-endpoint", receiver.url, "--", RETRIED_JOB, home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "run traced-1 SUCCEEDED after 2 attempts (exit 0)" in result.stderr
    trace_id = status_json("traced-1", tmp_path)["trace_id"]
    assert HEX32.match(trace_id)

    spans = received_spans(receiver)
    assert {span["trace_id"] for span in spans} == {trace_id}
    assert {span["resource"]["service.name"] for span in spans} == {"raypulse-launcher"}
    [root] = [span for span in spans if span["parent"] is None]
    assert root["name"] == "launcher.run"
    assert root["attributes"] == {"raypulse.run_id": "traced-1", "raypulse.job_name": "traced",
                                  "raypulse.backend": "local", "raypulse.max_attempts": 2,
                                  "raypulse.state": "SUCCEEDED", "raypulse.exit_code": 0, "raypulse.attempts": 2}
    assert not root["error"]
    top = children(spans, root)
    assert [span["name"] for span in top] == ["cluster.start", "attempt", "retry.backoff", "attempt",
                                              "cluster.teardown"]
    start, first, backoff, second, teardown = top
    assert [span["name"] for span in children(spans, start)] == ["cluster.wait_nodes"]
    assert first["end"] <= backoff["start"]
    assert backoff["end"] <= second["start"]
    assert teardown["attributes"]["raypulse.cluster"] == "traced-1"
    assert backoff["attributes"]["raypulse.next_attempt"] == 2
    for number, (span, state) in enumerate([(first, "FAILED"), (second, "SUCCEEDED")], start=1):
        assert span["attributes"]["raypulse.attempt"] == number
        assert span["attributes"]["raypulse.submission_id"] == f"traced-1-a{number}"
        assert span["attributes"]["raypulse.state"] == state
        assert span["error"] == (state == "FAILED")
        assert [child["name"] for child in children(spans, span)] == ["attempt.submit", "attempt.pending",
                                                                      "attempt.running"]
    assert first["attributes"]["raypulse.driver_exit_code"] == 1

    # The job joins the trace under its attempt's span, and sees the trace id in its Ray job metadata.
    parents = re.findall(r"traceparent=00-([0-9a-f]{32})-([0-9a-f]{16})-0[0-9a-f]", result.stdout)
    assert parents == [(trace_id, first["span_id"]), (trace_id, second["span_id"])]
    assert re.findall(r"metadata trace_id=(\w+)", result.stdout) == [trace_id, trace_id]
    # Every audit line of the run carries the trace id.
    lines = [line for line in audit_actions(tmp_path) if "traced-1" in (line.get("run_id"), line.get("cluster"))]
    assert [line["action"] for line in lines] == ["cluster.up", "attempt.submit", "attempt.submit", "run.finish",
                                                  "cluster.down"]
    assert {line.get("trace_id") for line in lines} == {trace_id}


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_hanging_endpoint_leaves_the_job_alone(shared_cluster: SharedCluster):
    receiver = OtlpReceiver(mode="hang").start()
    shared_cluster.record()
    home = shared_cluster.home
    # The endpoint from the standard variable this time; the run goes into the shared kept cluster, where its
    # job metadata stays to be read back.
    result = launcher("submit", "--cluster", SharedCluster.name, "--run-id", "hung-1", "--", "echo done", home=home,
                      OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url)
    exited = time.time()
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout
    assert "the run's trace did not all reach" in result.stderr  # one warning, at the end
    assert "Failed to export" not in result.stderr  # not the SDK's, batch after batch
    # The run's end to the process's: the bounded flush and Python's exit, nothing more.
    [finish] = [line for line in audit_actions(home)
                if line["action"] == "run.finish" and line.get("run_id") == "hung-1"]
    assert exited - finish["unix_time"] < FLUSH_TIMEOUT_S + 6
    trace_id = status_json("hung-1", home)["trace_id"]
    assert HEX32.match(trace_id)
    assert finish["trace_id"] == trace_id
    # The Ray job metadata, read back from the cluster, has the same trace id.
    assert status_json("hung-1", home, "--cluster", SharedCluster.name)["trace_id"] == trace_id
    assert receiver.traces == []
