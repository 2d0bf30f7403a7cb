"""Traces of a run's lifecycle, pushed over OTLP/HTTP when an endpoint is configured.

One trace per `launcher submit` (docs/tracing.md): launcher.run, with cluster.start (and its
cluster.wait_nodes), one `attempt` span per attempt (attempt.submit, attempt.pending,
attempt.running), retry.backoff between attempts and cluster.teardown. opentelemetry-sdk does the
protocol: spans are batched and exported from the SDK's own thread, so a slow or dead endpoint
never delays the job, and the final flush is bounded (FLUSH_TIMEOUT_S). Without an endpoint the SDK
is not even imported: the tracer is the API's no-op one and no trace id is recorded anywhere.
"""

from __future__ import annotations

import logging
import platform
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from exporter import __version__
from exporter import redact as exporter_redact
from exporter.config import signal_url
from launcher import redact

SERVICE_NAME = "raypulse-launcher"
TRACES_PATH = "/v1/traces"
EXPORT_TIMEOUT_S = 2.0  # one export request (retries included) gives up after this long
FLUSH_TIMEOUT_S = 3.0  # the most a run's end waits for its last spans to leave
GOING_ON = {"STARTING", "PENDING", "RUNNING", "RETRYING"}  # run and Ray job states that are not an end


def traces_url(endpoint: str | None, environ: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP traces URL from the spec's `otlp_endpoint` (a base URL like
    OTEL_EXPORTER_OTLP_ENDPOINT; /v1/traces is added unless it is already there), else the standard
    OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variables; None when tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if endpoint:
        return signal_url(endpoint, TRACES_PATH)
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return signal_url(environ["OTEL_EXPORTER_OTLP_ENDPOINT"], TRACES_PATH)
    return None


def current_trace_id() -> str | None:
    """The trace id (32 hex) of the span current in this thread, if it is one we record."""
    span = trace.get_current_span()
    return trace.format_trace_id(span.get_span_context().trace_id) if span.is_recording() else None


def traceparent(span: Span) -> str | None:
    """The W3C traceparent of a recorded span (what TRACEPARENT carries to the job)."""
    if not span.is_recording():
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent")


def end_span(span: Span, state: str, message: str | None = None, attributes: Mapping[str, Any] | None = None) -> None:
    """End a span with its state (and more attributes). A final state other than SUCCEEDED is an
    error; a run or attempt left going on (the launcher closed before its end) is not."""
    span.set_attribute("raypulse.state", state)
    span.set_attributes({key: value for key, value in (attributes or {}).items() if value is not None})
    if state not in GOING_ON and state != "SUCCEEDED":
        span.set_status(Status(StatusCode.ERROR, message or state))
    span.end()


class RunTrace:
    """The trace of one run: `tracer` for its spans, `root` (launcher.run), `finish()` at the end."""

    def __init__(self, url: str | None, attributes: Mapping[str, Any] | None = None,
                 warn: Callable[[str], None] | None = None) -> None:
        self.url = url
        self._warn = warn  # told once, at the end, when spans could not be sent
        self._provider = self._exporter = None
        if url is None:
            self.tracer: trace.Tracer = trace.NoOpTracer()
        else:
            self._provider, self._exporter = _sdk_provider(url)
            self.tracer = self._provider.get_tracer("raypulse.launcher", __version__)
        self.root = self.tracer.start_span("launcher.run", attributes=attributes)
        # 32 hex, or None when the run is not traced (then no trace id is written anywhere).
        self.trace_id = trace.format_trace_id(self.root.get_span_context().trace_id) \
            if self.root.is_recording() else None
        self._finished = False

    @classmethod
    def off(cls) -> RunTrace:
        return cls(None)

    def current(self) -> AbstractContextManager[Span]:
        """Make the root the current span in this thread (spans started inside are its children)."""
        return trace.use_span(self.root, end_on_exit=False)

    def span(self, name: str, **attributes: Any) -> AbstractContextManager[Span]:
        """A child of the current span for the duration of a `with` (an exception marks it ERROR)."""
        return self.tracer.start_as_current_span(name, attributes=attributes)

    def finish(self, state: str, message: str | None = None, attributes: Mapping[str, Any] | None = None) -> None:
        """End the root and flush, bounded: a hanging endpoint costs at most FLUSH_TIMEOUT_S."""
        if self._finished:
            return
        self._finished = True
        end_span(self.root, state, message, attributes)
        if self._provider is not None:
            # The SDK's shutdown (a last export, then the exporter's) has no bound of its own that we
            # can pass: it runs beside us, and a hanging endpoint is left behind after FLUSH_TIMEOUT_S.
            flush = threading.Thread(target=self._provider.shutdown, name="raypulse-trace-flush", daemon=True)
            flush.start()
            flush.join(FLUSH_TIMEOUT_S)
            if (self._exporter.failed or flush.is_alive()) and self._warn is not None:
                self._warn(f"the run's trace did not all reach {redact.text(self.url)} ({self._exporter.failed} span "
                           f"batch(es) failed{'; the last flush timed out' if flush.is_alive() else ''}); the job "
                           "was not affected")


class AttemptSpan:
    """An attempt's span and its phase children (attempt.pending, attempt.running), which follow
    Ray's status as the run polls it."""

    def __init__(self, run_trace: RunTrace, run_id: str, attempt: int, submission_id: str) -> None:
        self._tracer = run_trace.tracer
        self.span = self._tracer.start_span("attempt", context=trace.set_span_in_context(run_trace.root), attributes={
            "raypulse.run_id": run_id, "raypulse.attempt": attempt, "raypulse.submission_id": submission_id})
        self._phase: tuple[str, Span] | None = None
        self._child: Span | None = None  # attempt.submit while the attempt is submitted

    def open_child(self, name: str) -> None:
        self.close_child()
        self._child = self._tracer.start_span(name, context=trace.set_span_in_context(self.span))

    def close_child(self, error: str | None = None) -> None:
        if self._child is not None:
            if error:
                self._child.set_status(Status(StatusCode.ERROR, error))
            self._child.end()
            self._child = None

    def phase(self, status: str) -> None:
        """Enter attempt.pending or attempt.running by Ray's status (other statuses change nothing)."""
        name = {"PENDING": "attempt.pending", "RUNNING": "attempt.running"}.get(status)
        if name is None or (self._phase and self._phase[0] == name):
            return
        self._end_phase()
        self._phase = (name, self._tracer.start_span(name, context=trace.set_span_in_context(self.span)))

    def _end_phase(self) -> None:
        if self._phase is not None:
            self._phase[1].end()
            self._phase = None

    def end(self, state: str, message: str | None = None, driver_exit_code: int | None = None) -> None:
        self.close_child()
        self._end_phase()
        end_span(self.span, state, message, {"raypulse.driver_exit_code": driver_exit_code})


def _sdk_provider(url: str) -> tuple[Any, Any]:
    """A TracerProvider exporting to url, and its exporter (which counts failed batches)."""
    # Imported here: a run without an endpoint does not pay for the SDK and the exporter.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class CountingExporter(SpanExporter):
        """Counts failed batches, so the run ends with one warning instead of a log line per batch."""

        def __init__(self, inner: SpanExporter) -> None:
            self.inner = inner
            self.failed = 0

        def export(self, spans: Any) -> SpanExportResult:
            try:
                result = self.inner.export(spans)
            except Exception:  # noqa: BLE001 - an exporter bug must not kill the SDK's export thread
                result = SpanExportResult.FAILURE
            self.failed += result is not SpanExportResult.SUCCESS
            return result

        def shutdown(self) -> None:
            self.inner.shutdown()

    # The exporter logs every failed batch; on the launcher's stderr that would run through the
    # job's output every few seconds while an endpoint is down.
    quiet = logging.getLogger(OTLPSpanExporter.__module__)
    quiet.propagate = False
    quiet.addHandler(logging.NullHandler())
    exporter_redact.guard_loggers()  # and whatever still prints (the SDK's own lines) hides the URL's credentials
    exporter = CountingExporter(OTLPSpanExporter(endpoint=url, timeout=EXPORT_TIMEOUT_S))
    processor = BatchSpanProcessor(exporter, export_timeout_millis=EXPORT_TIMEOUT_S * 1000)
    # OTEL_RESOURCE_ATTRIBUTES is merged by Resource.create; no exit hook (finish() flushes, bounded).
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME, "service.version": __version__,
                                                        "host.name": platform.node()}),
                              shutdown_on_exit=False)
    provider.add_span_processor(processor)
    return provider, exporter

