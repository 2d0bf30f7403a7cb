"""A credential in an OTLP endpoint's query: the signal path goes before the query, and neither
the exporter's pushes nor opentelemetry's own log lines print it (issue 29, finding 4)."""

from __future__ import annotations

import logging
import sys

import pytest

from exporter import redact
from exporter.config import OtlpSettings
from exporter.framework.selfmetrics import OTLP_DROPPED_POINTS
from exporter.framework.snapshot import SampleSink
from exporter.serving.otlp import OtlpPusher
from launcher.tracing import traces_url
from tests.conftest import free_port
from tests.otlp_receiver import OtlpReceiver


def test_the_signal_path_goes_before_the_query():
    assert OtlpSettings(endpoint="http://c:4318?api_key=Q").url({}) == "http://c:4318/v1/metrics?api_key=Q"
    assert OtlpSettings(endpoint="http://c:4318/otlp/?k=Q").url({}) == "http://c:4318/otlp/v1/metrics?k=Q"
    assert OtlpSettings(endpoint="http://c:4318/v1/metrics?k=Q").url({}) == "http://c:4318/v1/metrics?k=Q"
    assert OtlpSettings().url({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/?k=Q"}) == "http://c:4318/v1/metrics?k=Q"
    assert traces_url("http://c:4318?api_key=Q", {}) == "http://c:4318/v1/traces?api_key=Q"
    assert traces_url("http://c:4318/v1/traces?k=Q", {}) == "http://c:4318/v1/traces?k=Q"
    assert traces_url(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318?k=Q"}) == "http://c:4318/v1/traces?k=Q"


def test_a_push_with_a_key_in_the_query_reaches_the_receiver_on_its_path():
    receiver = OtlpReceiver().start()
    settings = OtlpSettings(endpoint=receiver.url + "?api_key=Q", interval_seconds=3600, timeout_seconds=2)
    sink = SampleSink("exporter")
    sink.add(OTLP_DROPPED_POINTS, 1)
    snapshot = sink.freeze(0)
    pusher = OtlpPusher(settings, settings.url({}), cluster=None, snapshots=lambda: [snapshot])
    try:
        pusher._provider.force_flush(5000)
    finally:
        pusher.shutdown()
    assert "raypulse_exporter_otlp_dropped_points" in receiver.metric_points()


def test_a_failed_push_logs_no_credential_of_the_url(caplog: pytest.LogCaptureFixture):
    endpoint = f"http://user:PASSWORD@127.0.0.1:{free_port()}/v1/metrics?api_key=QSECRET"  # nobody listens
    settings = OtlpSettings(endpoint=endpoint, interval_seconds=3600, timeout_seconds=1)
    sink = SampleSink("exporter")
    sink.add(OTLP_DROPPED_POINTS, 1)
    snapshot = sink.freeze(0)
    caplog.set_level(logging.WARNING)
    pusher = OtlpPusher(settings, settings.url({}), cluster=None, snapshots=lambda: [snapshot])
    try:
        pusher._provider.force_flush(3000)  # a connection refused, retried once: requests quotes the URL
    finally:
        pusher.shutdown()
    logged = caplog.text
    # Which lines the SDK writes within the flush depends on how fast the refused connection is retried
    # (a timeout on a loaded machine); that none of them carries the credentials does not.
    assert "QSECRET" not in logged
    assert "PASSWORD" not in logged
    for name in redact.OTEL_EXPORT_LOGGERS:  # every logger that writes the URL is guarded
        assert any(isinstance(f, redact.UrlCredentialsFilter) for f in logging.getLogger(name).filters), name


def test_the_log_filter_hides_queries_and_userinfo_in_any_line_and_traceback():
    assert redact.urls_in("Max retries exceeded with url: /v1/metrics?api_key=S (Caused by X)") == \
        "Max retries exceeded with url: /v1/metrics?<redacted> (Caused by X)"
    assert redact.urls_in("to https://u:p@c:4318/v1/traces?k=S, retrying") == \
        "to https://<redacted>@c:4318/v1/traces?<redacted> retrying"
    assert redact.urls_in("is it? yes") == "is it? yes"
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("http://c/?k=S",), None)
    try:
        raise ConnectionError("url: /v1/metrics?k=S")
    except ConnectionError:
        record.exc_info = sys.exc_info()
    redact.UrlCredentialsFilter().filter(record)
    assert record.getMessage() == "failed http://c/?<redacted>"
    assert "k=S" not in record.exc_text
    assert "?<redacted>" in record.exc_text
