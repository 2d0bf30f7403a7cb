"""The live /metrics of a real exporter process against promtool and the metric catalog."""

from __future__ import annotations

import gzip
import subprocess

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.framework.catalog import CATALOG, MetricType
from exporter.framework.collector import REGISTRY, load_collectors
from tests.conftest import binary

OPENMETRICS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
                      "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")  # what Prometheus 2.42 sends


def live_families(text: str) -> dict[str, tuple[str, set[frozenset[str]]]]:
    """family name (as the catalog spells it) -> (type, label-name sets seen)."""
    families = {}
    for family in parse_text(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        families[name] = (family.type, {frozenset(sample.labels) for sample in family.samples})
    return families


def test_promtool_check_metrics_prints_nothing(node_exporter_module):
    result = subprocess.run([binary("promtool"), "check", "metrics"], input=node_exporter_module.metrics_text(),
                            capture_output=True, text=True, timeout=60)
    assert result.stdout + result.stderr == ""
    assert result.returncode == 0


def test_every_live_family_is_in_the_catalog_with_its_type_and_labels(node_exporter_module):
    load_collectors()
    live = live_families(node_exporter_module.metrics_text())
    undeclared = sorted(set(live) - {spec.name for spec in CATALOG})
    assert not undeclared, f"served but not in the catalog: {undeclared}"
    for name, (live_type, label_sets) in live.items():
        spec = CATALOG.get(name)
        expected_type = "gauge" if spec.type is MetricType.INFO else spec.type.value  # info renders as gauge
        assert live_type == expected_type, name
        assert label_sets == {frozenset(spec.labels)}, name


def test_every_catalog_family_is_served_unless_it_depends_on_absent_hardware(node_exporter_module):
    load_collectors()
    live = live_families(node_exporter_module.metrics_text())
    missing = sorted(spec.name for spec in CATALOG if spec.name not in live and spec.only_when is None)
    assert not missing, f"declared, always expected, but not served: {missing}"


def test_the_node_and_pod_collectors_declare_at_least_fifty_families():
    load_collectors()
    node_and_pod = [s for s in CATALOG if s.name.startswith(("raypulse_node_", "raypulse_pod_"))]
    assert len(node_and_pod) >= 50, len(node_and_pod)


def test_every_collector_is_up_and_error_free(node_exporter_module):
    families = {f.name: f for f in parse_text(node_exporter_module.metrics_text())}
    up = {s.labels["collector"]: s.value for s in families["raypulse_exporter_collector_up"].samples}
    assert set(up) == {name for name, cls in REGISTRY.items() if cls.default_enabled}
    assert all(value == 1 for value in up.values()), up
    errors = [s for s in families["raypulse_exporter_collector_errors"].samples
              if s.name.endswith("_total") and s.value]
    assert not errors


def test_openmetrics_is_served_when_asked_and_parses(node_exporter_module):
    status, headers, body = node_exporter_module.get(headers={"Accept": OPENMETRICS_ACCEPT})
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    text = body.decode()
    assert text.endswith("# EOF\n")
    names = {family.name for family in parse_openmetrics(text)}
    assert "raypulse_node_cpu_seconds" in names  # OpenMetrics names counters without _total
    assert "# UNIT raypulse_node_memory_total_bytes bytes" in text


def test_plain_text_is_the_default_and_gzip_is_used_when_accepted(node_exporter_module):
    status, headers, _body = node_exporter_module.get()
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "Content-Encoding" not in headers
    assert {v.strip() for v in headers["Vary"].split(",")} == {"Accept", "Accept-Encoding"}
    status, headers, compressed = node_exporter_module.get(headers={"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(compressed).startswith(b"# HELP ")


def test_health_readiness_and_landing_page(node_exporter_module):
    assert node_exporter_module.get("/healthz")[:1] == (200,)
    assert node_exporter_module.get("/readyz")[0] == 200
    status, headers, body = node_exporter_module.get("/")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert b'href="/metrics"' in body
    assert b"<td>filesystem</td><td>up</td>" in body
