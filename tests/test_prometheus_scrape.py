"""A real Prometheus scrapes a real exporter: the target is healthy and node series query back."""

from __future__ import annotations

import pytest

from alerts.prometheus import config, render
from tests.conftest import wait_until

pytestmark = pytest.mark.slow  # real servers for several seconds each: left out of `make test-quick`


def test_prometheus_scrapes_the_exporter_and_queries_node_series(start_exporter, start_prometheus):
    exporter = start_exporter()
    prometheus = start_prometheus(render(config(targets=[exporter.url.removeprefix("http://")],
                                                scrape_interval="1s", rules=[])))

    def target():
        targets = prometheus.api("/api/v1/targets")["data"]["activeTargets"]
        return targets[0] if targets and targets[0]["health"] != "unknown" else None

    wait_until(lambda: target() is not None, 30, "the first scrape")
    # rate() needs two samples of a counter.
    wait_until(lambda: prometheus.query("rate(raypulse_node_cpu_seconds_total[10s])"), 30, "two scrapes")
    assert target()["health"] == "up"
    assert target()["lastError"] == ""

    memory = prometheus.query("raypulse_node_memory_total_bytes")
    assert len(memory) == 1
    assert float(memory[0]["value"][1]) > 0
    modes = {r["metric"]["mode"] for r in prometheus.query("rate(raypulse_node_cpu_seconds_total[10s])")}
    assert {"user", "system", "idle", "iowait"} <= modes
    busy = prometheus.query('sum(rate(raypulse_node_cpu_seconds_total{mode!="idle"}[10s]))')
    assert 0 <= float(busy[0]["value"][1]) <= 64
    root = prometheus.query('raypulse_node_filesystem_avail_bytes{mountpoint="/"}')
    assert float(root[0]["value"][1]) > 0
    down = prometheus.query("raypulse_exporter_collector_up == 0")
    assert down == []
    # Prometheus' own view of the scrape: no samples rejected, no scrape that failed.
    assert prometheus.query("scrape_samples_scraped")[0]["value"][1] != "0"
    assert prometheus.query("sum(up{job='raypulse'})")[0]["value"][1] == "1"
    # The OpenMetrics path (what Prometheus negotiates) kept units and types intact.
    metadata = prometheus.api("/api/v1/metadata?metric=raypulse_node_memory_total_bytes")["data"]
    assert metadata["raypulse_node_memory_total_bytes"][0] == {
        "type": "gauge", "unit": "bytes", "help": "Physical memory."}
    metadata = prometheus.api("/api/v1/metadata?metric=raypulse_node_cpu_seconds")["data"]
    assert metadata["raypulse_node_cpu_seconds"][0]["type"] == "counter"
