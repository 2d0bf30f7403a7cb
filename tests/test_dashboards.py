"""The dashboards without a Grafana: the committed JSON is what the builders produce, it passes
checks in the spirit of grafana/dashboard-linter (which is Go-only and cannot be installed
here), every query parses (promtool), every catalog family is read by a dashboard or an alert,
and `dashboards.provision` writes a tree Grafana can load."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards import build, coverage, promql, provision
from dashboards.builder import TAG, UNITS
from dashboards.provisioner import DATASOURCE_UID, JSON_DIR
from dashboards.selectors import FOREIGN, TARGET_LABELS, VARIABLES, catalog, records
from tests.conftest import binary

DASHBOARDS = {path.stem: json.loads(path.read_text()) for path in sorted(JSON_DIR.glob("*.json"))}
DS = "${datasource}"
# Counters shown as running totals on purpose (dashboard-linter's target-counter-agg-rule would
# want a rate): counts since the driver loaded or the exporter started, where the number itself
# is the state (one uncorrected ECC error matters; a rate of 0.003/s says nothing).
COUNTERS_SHOWN_AS_TOTALS = {
    "raypulse_gpu_xid_errors_total", "raypulse_gpu_events_total", "raypulse_gpu_ecc_errors_total",
    "raypulse_gpu_ecc_lifetime_errors_total", "raypulse_gpu_ecc_location_errors_total",
    "raypulse_gpu_lost_events_total", "raypulse_gpu_nvlink_link_errors_total",
    "raypulse_gpu_nvlink_recovery_events_total", "raypulse_gpu_pcie_replays_total",
    "raypulse_gpu_pcie_replay_rollovers_total", "raypulse_gpu_pcie_l0_to_recovery_total",
    "raypulse_gpu_pcie_errors_total", "raypulse_gpu_event_watcher_errors_total",
    "raypulse_train_nonfinite_values_total", "raypulse_train_checkpoints_total",
    "raypulse_train_client_dropped_reports_total", "raypulse_run_recoveries_total", "raypulse_run_steps_lost_total",
}
COUNTER_FUNCTIONS = ("rate", "irate", "increase", "changes", "resets")


def panels(dashboard: dict) -> list[dict]:
    """Every panel, rows and the panels of collapsed rows included."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


def visualizations(dashboard: dict) -> list[dict]:
    return [panel for panel in panels(dashboard) if panel["type"] != "row"]


def variables(dashboard: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def test_the_committed_files_are_what_the_builders_produce():
    stale = build.stale()
    assert not stale, f"stale generated files {[str(p) for p in stale]}: run `make dashboards`"


def test_there_are_the_six_dashboards_with_unique_uids_and_titles():
    assert set(DASHBOARDS) == {"raypulse-cluster", "raypulse-job", "raypulse-node", "raypulse-gpu",
                               "raypulse-training", "raypulse-rl"}
    assert {d["uid"] for d in DASHBOARDS.values()} == set(DASHBOARDS)
    assert len({d["title"] for d in DASHBOARDS.values()}) == len(DASHBOARDS)
    for dashboard in DASHBOARDS.values():
        assert dashboard["schemaVersion"] == 41  # the 11.6 SDK build: Grafana 10-12 import it
        assert dashboard["editable"] is False  # provisioned: changes belong in dashboards/boards/
        assert TAG in dashboard["tags"]


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_template_variables(uid):
    found = variables(DASHBOARDS[uid])
    datasources = [v for v in found.values() if v["type"] == "datasource"]
    assert len(datasources) == 1
    assert datasources[0]["name"] == "datasource"
    assert datasources[0]["label"] == "Data source"
    assert datasources[0]["query"] == "prometheus"
    assert "cluster" in found
    for name, variable in found.items():
        if variable["type"] != "query":
            continue
        assert name in VARIABLES
        assert variable["datasource"]["uid"] == DS
        assert variable["refresh"] == 2  # reload on time range change
        assert variable["multi"]
        assert variable["includeAll"]
        assert variable["allValue"]
        selector = promql.label_values_selector(variable["query"])
        assert selector, variable["query"]
        if name != "cluster":  # options of the other variables follow the chosen cluster
            assert 'cluster=~"$cluster"' in selector


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_every_panel_has_a_title_description_unit_datasource_and_queries(uid):
    for panel in visualizations(DASHBOARDS[uid]):
        where = f"{uid}: panel {panel.get('title')!r}"
        assert panel.get("title"), where
        assert panel.get("description"), where
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        assert unit in UNITS or unit.startswith("suffix:"), f"{where}: unit {unit!r}"
        assert panel["datasource"] == {"type": "prometheus", "uid": DS}, where
        assert panel.get("targets"), where
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"]), where
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == DS, where
            assert target["expr"].strip(), where


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_panel_titles_are_unique_in_a_dashboard(uid):
    titles = [panel["title"] for panel in panels(DASHBOARDS[uid])]
    assert len(titles) == len(set(titles)), sorted(t for t in titles if titles.count(t) > 1)


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_graphs_show_a_legend_and_name_every_series(uid):
    for panel in visualizations(DASHBOARDS[uid]):
        if panel["type"] in ("timeseries", "statetimeline"):
            assert panel["options"]["legend"]["showLegend"], panel["title"]
        if panel["type"] != "table":
            for target in panel["targets"]:
                assert target.get("legendFormat"), f"{uid}: {panel['title']}: {target['expr']}"


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_panel_ids_are_unique_and_the_grid_has_no_overlaps(uid):
    dashboard = DASHBOARDS[uid]
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids))
    assert min(ids) > 0
    containers = [dashboard["panels"]] + [row["panels"] for row in dashboard["panels"] if row.get("panels")]
    for container in containers:
        cells: dict[tuple[int, int], str] = {}
        for panel in container:
            grid = panel["gridPos"]
            assert grid["x"] >= 0, panel["title"]
            assert grid["x"] + grid["w"] <= 24, panel["title"]
            for x in range(grid["x"], grid["x"] + grid["w"]):
                for y in range(grid["y"], grid["y"] + grid["h"]):
                    assert (x, y) not in cells, f"{panel['title']} overlaps {cells.get((x, y))}"
                    cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_every_selector_uses_the_dashboards_variables_and_no_hard_coded_target(uid):
    """Each selector reads a known family and filters every variable whose label the family
    carries (cluster always); target labels are never matched against a literal."""
    dashboard = DASHBOARDS[uid]
    board_variables = [name for name in variables(dashboard) if name in VARIABLES]
    families = catalog()
    for panel, target in promql.iter_targets(dashboard):
        expr = target["expr"]
        assert not re.search(r"\d+\.\d+\.\d+\.\d+|localhost", expr), f"hard-coded address in {expr}"
        for selector in promql.selectors(expr):
            where = f"{uid}: {panel['title']}: {selector.metric}"
            if selector.metric in FOREIGN:
                labels = FOREIGN[selector.metric]
            elif selector.metric in records():
                labels = records()[selector.metric]
            else:
                assert selector.metric in families, f"{where}: not in the metric catalog nor a recorded aggregation"
                labels = set(families[selector.metric].labels) | TARGET_LABELS
            for name in board_variables:
                label = VARIABLES[name].series_label
                if label in labels:
                    assert selector.matcher(label) == ("=~", f"${name}"), f"{where}: no {label}=~\"${name}\""
            for label, _, value in selector.matchers:
                if label in TARGET_LABELS:
                    assert value.startswith("$"), f"{where}: hard-coded {label}={value!r}"


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_counters_are_rated_over_the_rate_interval(uid):
    """dashboard-linter's target-rate-interval and target-counter-agg rules, with the windows
    we use on purpose: $__range for totals over the view and 1h for baselines."""
    for panel, target in promql.iter_targets(DASHBOARDS[uid]):
        expr = target["expr"]
        for window in promql.ranges(expr):
            assert window in ("$__rate_interval", "$__range", "1h"), f"{panel['title']}: [{window}] in {expr}"
        for selector in promql.selectors(expr):
            if selector.metric.endswith("_total") and selector.metric not in COUNTERS_SHOWN_AS_TOTALS:
                call = re.search(rf"({'|'.join(COUNTER_FUNCTIONS)})\(\s*{selector.metric}\{{", expr)
                # Counting a counter's series reads no value (node_exporter's CPUs: one idle series each).
                call = call or re.search(rf"count by \([^)]*\) \(\s*{selector.metric}\{{", expr)
                assert call, f"{uid}: {panel['title']}: counter {selector.metric} not rated in {expr}"


def test_links_lead_to_dashboards_and_variables_that_exist():
    for uid, dashboard in DASHBOARDS.items():
        menu = [link for link in dashboard["links"] if link["type"] == "dashboards"]
        assert len(menu) == 1, uid
        assert menu[0]["tags"] == [TAG], uid
        assert menu[0]["includeVars"], uid
        assert menu[0]["keepTime"], uid
        for panel in visualizations(dashboard):
            for link in panel["fieldConfig"]["defaults"].get("links", []):
                match = re.match(r"/d/([a-z-]+)/", link["url"])
                assert match, link["url"]
                assert match.group(1) in DASHBOARDS, link["url"]
                for name in re.findall(r"var-([a-z]+)=", link["url"]):
                    assert name in variables(DASHBOARDS[match.group(1)]), f"{uid}: {link['url']}"
                assert "${__url_time_range}" in link["url"]
    job_links = {link["url"].split("?")[0] for panel in visualizations(DASHBOARDS["raypulse-gpu"])
                 for link in panel["fieldConfig"]["defaults"].get("links", [])}
    assert "/d/raypulse-job/raypulse-job" in job_links  # GPU -> its job
    node_links = {link["url"].split("?")[0] for panel in visualizations(DASHBOARDS["raypulse-job"])
                  for link in panel["fieldConfig"]["defaults"].get("links", [])}
    assert "/d/raypulse-node/raypulse-node" in node_links  # job -> its nodes


def test_every_query_parses(tmp_path):
    """promtool parses each query (Grafana's macros and variables filled in) as a recording rule."""
    expressions = []
    for dashboard in DASHBOARDS.values():
        values = {name: ".*" for name in variables(dashboard)}
        expressions += [promql.fill(target["expr"], values) for _, target in promql.iter_targets(dashboard)]
        expressions += [promql.fill(promql.label_values_selector(v["query"]), values)
                        for v in variables(dashboard).values() if v["type"] == "query"]
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"raypulse_dashboard_query_{i}", "expr": expr} for i, expr in enumerate(expressions)]}]}
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([binary("promtool"), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(expressions)} rules found" in result.stdout
    print(f"promtool parsed {len(expressions)} dashboard queries")


def test_the_promql_reader_finds_selectors_not_labels_or_functions():
    expr = ('sum by (node, mode) (rate(raypulse_node_cpu_seconds_total{cluster=~"$cluster", mode!="idle"}'
            '[$__rate_interval])) / on (cluster, node) group_left () sum by (cluster, node) (raypulse_node_cpus)'
            ' * 1e-3 > bool 0')
    found = promql.selectors(expr)
    assert [s.metric for s in found] == ["raypulse_node_cpu_seconds_total", "raypulse_node_cpus"]
    assert found[0].matchers == (("cluster", "=~", "$cluster"), ("mode", "!=", "idle"))
    assert promql.ranges(expr) == ["$__rate_interval"]
    assert (promql.fill('x{a=~"$submission", b=~"${submission}"}[$__rate_interval]', {"submission": "j1"})
            == 'x{a=~"j1", b=~"j1"}[1m]')


def test_catalog_coverage_by_dashboards_and_alerts():
    result = coverage.measure()
    print(result.summary())
    assert result.share_not_informational == 1.0, result.uncovered


def test_provision_writes_a_tree_grafana_can_load(tmp_path):
    written = provision(tmp_path / "grafana", prometheus_url="http://127.0.0.1:19090", scrape_interval="5s")
    assert all(path.exists() for path in written.files)
    provider = yaml.safe_load((written.provisioning_dir / "dashboards" / "raypulse.yaml").read_text())
    path = Path(provider["providers"][0]["options"]["path"])
    assert path.is_absolute()
    assert path == written.dashboards_dir
    assert {p.name for p in path.glob("*.json")} == {f"{uid}.json" for uid in DASHBOARDS}
    for uid, dashboard in DASHBOARDS.items():
        assert json.loads((path / f"{uid}.json").read_text()) == dashboard
    source = yaml.safe_load((written.provisioning_dir / "datasources" / "raypulse.yaml").read_text())
    expected = {"uid": DATASOURCE_UID, "type": "prometheus", "url": "http://127.0.0.1:19090"}
    assert expected.items() <= source["datasources"][0].items()
    assert source["datasources"][0]["jsonData"]["timeInterval"] == "5s"
    assert source["datasources"][0]["isDefault"] is False  # next to kube-prometheus-stack's default
    assert str(written.provisioning_dir) in written.instructions()
    asked = provision(tmp_path / "alone", default_datasource=True)
    assert yaml.safe_load((asked.provisioning_dir / "datasources" / "raypulse.yaml").read_text())[
        "datasources"][0]["isDefault"] is True
