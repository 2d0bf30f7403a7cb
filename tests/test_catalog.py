"""The catalog's conventions, and docs/metrics.md generated from it."""

from __future__ import annotations

import subprocess

import pytest

from exporter.framework.catalog import CATALOG, Catalog, MetricSpec, MetricType, naming_problems
from exporter.framework.collector import REGISTRY, load_collectors
from tests.conftest import REPO, exporter_command


def test_docs_metrics_md_is_generated_from_the_catalog():
    generated = subprocess.run(exporter_command("metrics", "-o", "markdown"), capture_output=True, text=True,
                               check=True, timeout=60, cwd=REPO).stdout
    committed = (REPO / "docs" / "metrics.md").read_text()
    assert committed == generated, "docs/metrics.md is stale: run `make docs`"


def test_docs_configuration_md_is_generated_from_the_settings_model():
    generated = subprocess.run(exporter_command("config-reference"), capture_output=True, text=True, check=True,
                               timeout=60, cwd=REPO).stdout
    assert (REPO / "docs" / "configuration.md").read_text() == generated, "stale: run `make docs`"
    assert "`RAYPULSE_EXPORTER_NODE__CHECKPOINT_PATHS`" in generated


def test_every_family_follows_the_naming_conventions_and_belongs_to_a_collector():
    load_collectors()
    assert len(CATALOG) > 0
    for spec in CATALOG:
        assert naming_problems(spec) == [], spec.name
        assert spec.collector in REGISTRY or spec.collector == "exporter", spec.name


@pytest.mark.parametrize(("spec", "problem"), [
    (MetricSpec("raypulse_node_reads", MetricType.COUNTER, "Reads.", (), "x"), "counter names end in _total"),
    (MetricSpec("raypulse_node_size", MetricType.GAUGE, "Size.", (), "x", unit="megabytes"), "not a base unit"),
    (MetricSpec("raypulse_node_temp_celsius", MetricType.GAUGE, "Temp.", (), "x"), "unit is not declared"),
    (MetricSpec("raypulse_node_x", MetricType.GAUGE, "X.", ("job",), "x"), "reserved by Prometheus"),
    (MetricSpec("raypulse_node_x", MetricType.GAUGE, "X.", ("GPU",), "x"), "not snake_case"),
    (MetricSpec("node_x", MetricType.GAUGE, "X.", (), "x"), "raypulse_"),
    (MetricSpec("raypulse_node_x", MetricType.GAUGE, "no period", (), "x"), "help is a sentence"),
    (MetricSpec("raypulse_node_x", MetricType.INFO, "X.", (), "x"), "_info"),
])
def test_convention_violations_are_refused_at_declaration(spec, problem):
    assert any(problem in p for p in naming_problems(spec))
    with pytest.raises(ValueError, match=problem):
        Catalog().declare(spec)


def test_a_family_cannot_be_declared_twice():
    catalog = Catalog()
    catalog.declare(MetricSpec("raypulse_node_x", MetricType.GAUGE, "X.", (), "x"))
    with pytest.raises(ValueError, match="declared twice"):
        catalog.declare(MetricSpec("raypulse_node_x", MetricType.GAUGE, "X.", (), "x"))
