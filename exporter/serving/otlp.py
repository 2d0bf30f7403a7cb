"""Push the metric catalog over OTLP/HTTP, for backends that take OTLP instead of scraping.

opentelemetry-sdk does the protocol: one observable instrument per catalog family, whose
callback reads the snapshots the Prometheus side last rendered, and a periodic reader that
exports from its own thread. Nothing here runs on the event loop or in a scrape, so a slow or
dead endpoint never delays /metrics; the reader exports one batch at a time (memory stays
bounded: a batch that fails is dropped, not queued) and every outcome is counted.

Names match the Prometheus side once an OTLP-to-Prometheus translation adds its suffixes:
counters drop `_total` (monotonic sums get it back) and units use UCUM ("s", "By").
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from exporter import __version__, redact
from exporter.config import OtlpSettings
from exporter.framework.catalog import CATALOG, MetricSpec, MetricType
from exporter.framework.selfmetrics import OTLP_DROPPED_POINTS, OTLP_EXPORTS, OTLP_LAST_SUCCESS
from exporter.framework.snapshot import SampleSink, Series, Snapshot

UCUM_UNITS = {"seconds": "s", "bytes": "By", "celsius": "Cel", "watts": "W", "joules": "J", "hertz": "Hz",
              "ratio": "1", "volts": "V", "amperes": "A"}


def resource_attributes(cluster: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """Who is pushing; OTEL_RESOURCE_ATTRIBUTES is merged on top by the SDK."""
    attributes = {"service.name": "raypulse-exporter", "service.version": __version__,
                  "host.name": platform.node()}
    optional = {"k8s.pod.name": environ.get("POD_NAME"), "k8s.namespace.name": environ.get("POD_NAMESPACE"),
                "k8s.node.name": environ.get("NODE_NAME"), "ray.node.id": environ.get("RAY_NODE_ID"),
                "raypulse.cluster": cluster}
    attributes.update({key: value for key, value in optional.items() if value})
    return attributes


class _CountingExporter(MetricExporter):
    """Delegates to the OTLP exporter and counts what happened to every batch."""

    def __init__(self, inner: MetricExporter) -> None:
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self._inner = inner
        self._lock = threading.Lock()
        self.results = {"success": 0, "failure": 0}
        self.dropped_points = 0
        self.last_success: float | None = None

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        try:
            result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:  # noqa: BLE001  (an exporter bug must not kill the reader thread)
            result = MetricExportResult.FAILURE
        with self._lock:
            if result is MetricExportResult.SUCCESS:
                self.results["success"] += 1
                self.last_success = time.time()
            else:
                self.results["failure"] += 1
                self.dropped_points += _count_points(metrics_data)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _count_points(metrics_data: MetricsData) -> int:
    return sum(len(metric.data.data_points) for resource in metrics_data.resource_metrics
               for scope in resource.scope_metrics for metric in scope.metrics)


class _SnapshotIndex:
    """Family -> series of the latest rendered snapshots, rebuilt only when they change."""

    def __init__(self, snapshots: Callable[[], Sequence[Snapshot]]) -> None:
        self._snapshots = snapshots
        self._key: tuple[int, ...] = ()
        self._index: dict[MetricSpec, Series] = {}
        self._lock = threading.Lock()

    def series(self, spec: MetricSpec) -> Series:
        snapshots = self._snapshots()
        key = tuple(id(snapshot) for snapshot in snapshots)
        with self._lock:
            if key != self._key:
                self._index = {family: series for snapshot in snapshots for family, series in snapshot}
                self._key = key
            return self._index.get(spec, ())


class OtlpPusher:
    """Owns the MeterProvider that pushes every catalog family to one OTLP/HTTP endpoint."""

    def __init__(self, settings: OtlpSettings, url: str, cluster: str | None,
                 snapshots: Callable[[], Sequence[Snapshot]], environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        redact.guard_loggers()  # the SDK logs every failed push with the URL, query (an API key) and all
        otlp = OTLPMetricExporter(endpoint=url, headers=dict(settings.headers) or None,
                                  timeout=settings.timeout_seconds)
        self._exporter = _CountingExporter(otlp)
        reader = PeriodicExportingMetricReader(self._exporter,
                                               export_interval_millis=settings.interval_seconds * 1000,
                                               export_timeout_millis=settings.timeout_seconds * 1000)
        self._provider = MeterProvider(resource=Resource.create(resource_attributes(cluster, environ)),
                                       metric_readers=[reader])
        meter = self._provider.get_meter("raypulse.exporter", __version__)
        index = _SnapshotIndex(snapshots)
        for spec in CATALOG:
            callback = _observer(index, spec)
            name, unit = _otel_name(spec), UCUM_UNITS.get(spec.unit, "")
            if spec.type is MetricType.COUNTER:
                meter.create_observable_counter(name, [callback], unit=unit, description=spec.help)
            else:
                meter.create_observable_gauge(name, [callback], unit=unit, description=spec.help)
        self.url = url
        self._timeout_millis = settings.timeout_seconds * 1000

    def report(self, out: SampleSink) -> None:
        """Self metrics, added to the exporter's own snapshot."""
        counting = self._exporter
        with counting._lock:
            for result, count in counting.results.items():
                out.add(OTLP_EXPORTS, count, result=result)
            out.add(OTLP_DROPPED_POINTS, counting.dropped_points)
            out.add(OTLP_LAST_SUCCESS, counting.last_success)

    def shutdown(self) -> None:
        # Bounded: a final export gets the configured timeout, then the reader thread is abandoned.
        self._provider.shutdown(timeout_millis=self._timeout_millis)


def _otel_name(spec: MetricSpec) -> str:
    return spec.base_name if spec.type is MetricType.COUNTER else spec.name


def _observer(index: _SnapshotIndex, spec: MetricSpec) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, dict(zip(spec.labels, labels, strict=True))) for labels, value in index.series(spec)]

    return observe
