"""OTLP push of the whole catalog to a real OTLP/HTTP receiver, and what a bad endpoint costs."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import OtlpSettings
from tests.conftest import wait_until
from tests.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.slow  # real servers for several seconds each: left out of `make test-quick`

FAST_PUSH = {"RAYPULSE_EXPORTER_OTLP__INTERVAL_SECONDS": "1", "RAYPULSE_EXPORTER_OTLP__TIMEOUT_SECONDS": "1"}


def scrape_values(text: str) -> dict[str, dict[tuple, float]]:
    values: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return values


def attributes(point) -> tuple:
    return tuple(sorted((a.key, a.value.string_value) for a in point.attributes))


def test_every_served_family_is_pushed_with_the_same_name_unit_attributes_and_value(start_exporter):
    receiver = OtlpReceiver().start()
    exporter = start_exporter("--otlp-endpoint", receiver.url, env={**FAST_PUSH, "POD_NAME": "trainer-0"})
    seen: list[tuple[dict, dict]] = []

    def every_family_pushed() -> bool:
        """What /metrics serves now, all in the pushes so far (a push after every collector has run)."""
        scraped, pushed = scrape_values(exporter.metrics_text()), receiver.metric_points()
        seen[:] = [(scraped, pushed)]
        # Names: counters lose _total (an OTLP-to-Prometheus translation adds it back to monotonic sums).
        served = {name.removesuffix("_total") if name.endswith("_total") else name for name in scraped}
        return served - {"raypulse_exporter_otlp_last_success_timestamp_seconds"} <= set(pushed)

    wait_until(every_family_pushed, 30, "every family /metrics serves in an OTLP push")
    scraped, pushed = seen[-1]

    memory, resource = pushed["raypulse_node_memory_total_bytes"][-1]
    assert memory.unit == "By"
    assert memory.WhichOneof("data") == "gauge"
    assert memory.gauge.data_points[0].as_double == scraped["raypulse_node_memory_total_bytes"][()]
    assert resource["service.name"] == "raypulse-exporter"
    assert resource["k8s.pod.name"] == "trainer-0"

    cpu, _ = pushed["raypulse_node_cpu_seconds"][-1]
    assert cpu.unit == "s"
    assert cpu.sum.is_monotonic
    assert cpu.sum.aggregation_temporality == 2  # cumulative, like the Prometheus counter
    modes = {dict(attributes(p))["mode"] for p in cpu.sum.data_points}
    assert {"user", "system", "idle"} <= modes

    info, _ = pushed["raypulse_node_info"][-1]
    assert dict(attributes(info.gauge.data_points[0]))["hostname"]

    # The push's own health is in /metrics (as of the next rendering, within a collection interval).
    wait_until(lambda: scrape_values(exporter.metrics_text())["raypulse_exporter_otlp_exports_total"]
               [(("result", "success"),)] >= 1, 15, "the push to be counted")
    health = scrape_values(exporter.metrics_text())
    assert health["raypulse_exporter_otlp_last_success_timestamp_seconds"][()] > time.time() - 60


def test_a_hanging_endpoint_costs_scrapes_nothing_and_its_drops_are_counted(start_exporter):
    receiver = OtlpReceiver(mode="hang").start()
    exporter = start_exporter("--otlp-endpoint", receiver.url, env=FAST_PUSH)
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:  # every scrape answers at once while pushes hang
        status, _, _ = exporter.get("/metrics", timeout=1.0)
        assert status == 200
        time.sleep(0.2)

    def failures() -> float:
        return scrape_values(exporter.metrics_text())["raypulse_exporter_otlp_exports_total"].get(
            (("result", "failure"),), 0)

    wait_until(lambda: failures() >= 2, 20, "failed pushes to be counted")
    values = scrape_values(exporter.metrics_text())
    assert values["raypulse_exporter_otlp_dropped_points_total"][()] > 0
    assert values["raypulse_exporter_otlp_exports_total"][(("result", "success"),)] == 0


def test_a_dead_endpoint_is_counted_too(start_exporter):
    receiver = OtlpReceiver()  # never started: connection refused
    exporter = start_exporter("--otlp-endpoint", receiver.url, env=FAST_PUSH)
    wait_until(lambda: scrape_values(exporter.metrics_text())["raypulse_exporter_otlp_exports_total"]
               [(("result", "failure"),)] >= 1, 30, "a failed push")
    assert exporter.get("/healthz")[0] == 200


def test_the_endpoint_comes_from_the_flag_or_the_standard_variables():
    assert OtlpSettings(endpoint="http://c:4318").url({}) == "http://c:4318/v1/metrics"
    assert OtlpSettings(endpoint="http://c:4318/v1/metrics").url({}) == "http://c:4318/v1/metrics"
    assert OtlpSettings().url({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == "http://c:4318/v1/metrics"
    assert OtlpSettings().url({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m/x"}) == "http://m/x"
    assert OtlpSettings().url({}) is None
