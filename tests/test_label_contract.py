"""The label contract (exporter/contract/labels.py): one object names the cluster and node labels, the scrape
job the rules select and the runbook base, for alerts.build, dashboards.build and `exporter
manifests` alike. The default changes nothing; the KubeRay-style contract (`ray_io_cluster`) renders
rules that promtool accepts and whose unit tests still hold, manifests that carry exactly those rules
and dashboards, and dashboards whose queries find the series of a real exporter that a real
Prometheus relabels `cluster` -> `ray_io_cluster`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from alerts import build as alerts_build
from alerts import prometheus
from alerts.config import Config
from dashboards import build as dashboards_build
from dashboards import builder, livecheck, promql
from dashboards.boards import BOARDS
from dashboards.provisioner import JSON_DIR
from exporter.contract.labels import DEFAULT, KUBERAY, LabelContract
from launcher.cli import main as launcher_main
from launcher.deploy import manifests
from tests import test_k8s_manifests as k8s_tests
from tests.conftest import REPO, RunningPrometheus, binary, exporter_command, free_port, wait_until
from tests.ray_testcluster import start_prometheus, stop_process

UNIT_TESTS = sorted(path for path in (REPO / "alerts" / "tests").glob("*_test.yaml")
                    if not path.name.startswith("dcgm"))  # the opt-in dcgm-exporter names are not ours
ODD = LabelContract(cluster="zz_cluster", node="zz_node", scrape_job="rp", runbook_base="https://example.org/rb.md")
validators = k8s_tests.validators  # the schema fixture of the manifest tests
DEFAULT_NAMES = re.compile(r"\b(cluster|node)\b")


def kuberay_rules() -> dict[str, str]:
    return alerts_build.rule_files(Config(labels=KUBERAY))


# --- the contract itself ---------------------------------------------------------------------------

@pytest.mark.parametrize(("expr", "renamed"), [
    ('raypulse_node_load1{cluster=~"$cluster", node=~"$node"}',
     'raypulse_node_load1{zz_cluster=~"$cluster", zz_node=~"$node"}'),  # the values ($variables) stay
    ("sum by (cluster, node, gpu) (rate(x[5m])) / on (cluster, node) group_left (node) y",
     "sum by (zz_cluster, zz_node, gpu) (rate(x[5m])) / on (zz_cluster, zz_node) group_left (zz_node) y"),
    ("sum(x) without (node)", "sum(x) without (zz_node)"),
    ('label_replace(max by (node) (x), "node", "$1", "cluster", "(node.*)")',
     'label_replace(max by (zz_node) (x), "zz_node", "$1", "zz_cluster", "(node.*)")'),
    ('label_values(raypulse_gpu_info{cluster=~"$cluster"}, node)',
     'label_values(raypulse_gpu_info{zz_cluster=~"$cluster"}, zz_node)'),
    ('raypulse_node_cpus{role="node"} and raypulse_node_info',  # metric names and values stay
     'raypulse_node_cpus{role="node"} and raypulse_node_info'),
    ('up{job="raypulse", node!=""}', 'up{job="raypulse", zz_node!=""}'),
])
def test_a_contract_renames_label_names_in_promql_and_nothing_else(expr, renamed):
    assert ODD.promql(expr) == renamed
    assert DEFAULT.promql(expr) == expr


def test_a_contract_renames_legends_links_and_alert_templates():
    text = ("{{node}} GPU {{gpu}} | node {{ $labels.node }} in cluster {{ $labels.cluster }} | "
            "var-cluster=${__field.labels.cluster}&var-node=${__data.fields.node}")
    assert ODD.template(text) == ("{{zz_node}} GPU {{gpu}} | node {{ $labels.zz_node }} in cluster "
                                  "{{ $labels.zz_cluster }} | var-cluster=${__field.labels.zz_cluster}"
                                  "&var-node=${__data.fields.zz_node}")


def test_bad_contracts_are_refused_with_the_rule():
    with pytest.raises(ValueError, match="not a Prometheus label name"):
        LabelContract(cluster="ray.io/cluster")
    with pytest.raises(ValueError, match="must differ"):
        LabelContract(node="cluster")
    with pytest.raises(ValueError, match="already have"):
        LabelContract(node="instance")
    with pytest.raises(ValueError, match="not a Prometheus label name"):
        LabelContract(cluster="abc\n")  # a trailing newline is not part of a name


@pytest.mark.parametrize("job", ['j"} or vector(1) #', "", "job\n", "a b", "j{x}", "x" * 129])
def test_a_scrape_job_that_is_not_a_plain_name_never_reaches_the_rules(job):
    with pytest.raises(ValueError, match="is not a plain job name"):
        LabelContract(scrape_job=job)


# --- rules, dashboards and manifests read it --------------------------------------------------------

def test_the_default_contract_is_what_is_committed():
    assert alerts_build.stale_outputs() == []
    assert dashboards_build.stale() == []
    assert manifests.Options().labels == DEFAULT


def test_no_rule_keeps_a_default_label_name_under_another_contract():
    leftovers = []
    for text in alerts_build.rule_files(Config(labels=ODD)).values():
        for group in yaml.safe_load(text)["groups"]:
            for rule in group["rules"]:
                expr = rule["expr"]
                leftovers += [expr for selector in promql.selectors(expr) for label, _, value in selector.matchers
                              if label in ("cluster", "node") or (label == "job" and value == "raypulse")]
                leftovers += [m.group() for m in re.finditer(r"(by|without|on|ignoring|group_left|group_right)"
                                                             r"\s*\(([^)]*)\)", expr) if DEFAULT_NAMES.search(m[2])]
                leftovers += re.findall(r'"(?:cluster|node)"', expr)
                annotations = rule.get("annotations", {})
                leftovers += re.findall(r"\$labels\.(?:cluster|node)\b", " ".join(annotations.values()))
                if "alert" in rule:
                    assert annotations["runbook_url"].startswith("https://example.org/rb.md#")
    assert leftovers == []
    assert 'up{job="rp"}' in "".join(alerts_build.rule_files(Config(labels=ODD)).values())


def test_no_dashboard_keeps_a_default_label_name_under_another_contract():
    leftovers = []
    for board in BOARDS:
        built = builder.build(board, ODD)
        queries = [target["expr"] for _, target in promql.iter_targets(built)]
        queries += [v["query"] for v in built["templating"]["list"] if v["type"] == "query"]
        for expr in queries:
            leftovers += [expr for selector in promql.selectors(expr.replace("label_values(", "("))
                          for label, _, _ in selector.matchers if label in ("cluster", "node")]
            leftovers += [m.group() for m in re.finditer(r"(by|without|on|ignoring|group_left|group_right)"
                                                         r"\s*\(([^)]*)\)", expr) if DEFAULT_NAMES.search(m[2])]
            leftovers += re.findall(r'"(?:cluster|node)"|, (?:cluster|node)\)$', expr)
        text = json.dumps(built)
        leftovers += re.findall(r"\{\{\s*(?:cluster|node)\s*\}\}|(?:labels|fields)\.(?:cluster|node)\b", text)
    assert leftovers == []
    # The variables keep their names ($cluster, var-cluster=): only the labels they filter change.
    variables = {v["name"]: v["query"] for v in builder.build(BOARDS[0], KUBERAY)["templating"]["list"]
                 if v["type"] == "query"}
    assert variables["cluster"] == "label_values(raypulse_exporter_build_info, ray_io_cluster)"


def test_the_manifests_carry_the_rules_and_dashboards_the_builders_render_with_the_same_contract(validators):
    objects = manifests.render(manifests.Options(cluster_label="ray_io_cluster", release="kps"))
    assert [error for obj in objects for error in k8s_tests.problems(validators, obj)] == []
    (monitor,) = [obj for obj in objects if obj["kind"] == "ServiceMonitor"]
    targets = {item["targetLabel"] for item in monitor["spec"]["endpoints"][0]["relabelings"]}
    assert targets == {"ray_io_cluster", "node", "job"}
    (rule,) = [obj for obj in objects if obj["kind"] == "PrometheusRule"]
    built = [group for text in kuberay_rules().values() for group in yaml.safe_load(text)["groups"]]
    assert sorted(rule["spec"]["groups"], key=lambda g: g["name"]) == sorted(built, key=lambda g: g["name"])
    dashboards = {name: json.loads(text) for obj in objects if obj["kind"] == "ConfigMap"
                  for name, text in obj["data"].items()}
    assert dashboards == {f"{board.uid}.json": builder.build(board, KUBERAY) for board in BOARDS}


# --- promtool --------------------------------------------------------------------------------------

def _unit_test_in(contract: LabelContract, doc: dict) -> dict:
    """A promtool unit test file rewritten for `contract`: input series, expected labels and samples."""
    def labels(mapping: dict) -> dict:
        return {contract.label(key): value for key, value in mapping.items()}
    for test in doc["tests"]:
        for series in test.get("input_series", []):
            series["series"] = contract.promql(series["series"])
        for case in test.get("alert_rule_test", []):
            for alert in case.get("exp_alerts") or []:
                alert["exp_labels"] = labels(alert.get("exp_labels", {}))
        for case in test.get("promql_expr_test", []):
            case["expr"] = contract.promql(case["expr"])
            for sample in case.get("exp_samples") or []:
                sample["labels"] = contract.promql(sample["labels"])
    return doc


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (make system-deps)")
def test_promtool_accepts_the_kuberay_rules_and_their_unit_tests_hold(tmp_path):
    """The unit tests with their series relabelled as KubeRay's PodMonitor would label them, against
    the rules rendered with the KubeRay contract: every alert fires and stays quiet as before."""
    rules, tests = tmp_path / "rules", tmp_path / "tests"
    alerts_build.main(["--label-profile", "kuberay", "--out", str(rules)])
    result = subprocess.run([binary("promtool"), "check", "rules", "--lint=all", "--lint-fatal",
                             *map(str, sorted(rules.glob("*.yaml")))], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    tests.mkdir()
    for path in UNIT_TESTS:
        doc = _unit_test_in(KUBERAY, yaml.safe_load(path.read_text()))
        assert "ray_io_cluster" in json.dumps(doc), path.name
        (tests / path.name).write_text(yaml.safe_dump(doc, sort_keys=False, width=4096))
    result = subprocess.run([binary("promtool"), "test", "rules", *[path.name for path in UNIT_TESTS]],
                            cwd=tests, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


# --- the command lines ------------------------------------------------------------------------------

def test_each_builder_takes_the_contract_on_its_command_line(tmp_path):
    assert alerts_build.main(["--cluster-label", "ray_io_cluster", "--out", str(tmp_path / "rules")]) == 0
    assert {path.name: path.read_text() for path in (tmp_path / "rules").glob("*.yaml")} == kuberay_rules()
    assert dashboards_build.main(["--cluster-label", "ray_io_cluster", "--out", str(tmp_path / "json")]) == 0
    for board in BOARDS:
        assert (tmp_path / "json" / f"{board.uid}.json").read_text() == builder.render(board, KUBERAY)
    result = CliRunner().invoke(launcher_main, ["exporters", "manifests", "--cluster-label", "ray_io_cluster"])
    assert result.exit_code == 0, result.output
    assert "targetLabel: ray_io_cluster" in result.output
    for refused in (["--cluster-label", "ray_io_cluster"], ["--check", "--label-profile", "kuberay"],
                    ["--cluster-label", "ray.io/cluster", "--out", str(tmp_path)]):
        for module in (alerts_build, dashboards_build):
            with pytest.raises(SystemExit) as exited:
                module.main(refused)
            assert exited.value.code == 2, (module.__name__, refused)


# --- live: a real exporter, a real Prometheus relabelling cluster -> ray_io_cluster -----------------

CLUSTER = "lc-default"
KUBERAY_CLUSTER = "lc-kuberay"


@dataclass
class Scene:
    prometheus: RunningPrometheus
    kuberay_json: Path


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    """One exporter with two simulated GPUs, scraped twice by one Prometheus: as /sd labels it
    (`cluster`) and relabelled as KubeRay's PodMonitor labels it (`ray_io_cluster`, no `cluster`)."""
    base = Path(tempfile.mkdtemp(prefix="rplc-", dir="/tmp"))
    started: list[subprocess.Popen] = []
    try:
        dashboards_build.write_json(base / "json", KUBERAY)
        port = free_port()
        started.append(subprocess.Popen(
            exporter_command("serve", "--listen", f"127.0.0.1:{port}", "--progress-listen", "off",
                             "--simulate-gpus", "2", "--no-collector.ray", "--no-collector.ray_head",
                             "--no-collector.ray_processes"),
            stdout=(base / "exporter.log").open("wb"), stderr=subprocess.STDOUT, cwd=REPO))
        target = f"127.0.0.1:{port}"
        config = prometheus.config(targets=[(target, {"cluster": CLUSTER}), (target, {"cluster": KUBERAY_CLUSTER})],
                                   scrape_interval="1s", rules=[], relabel_configs=[
            # KubeRay's naming for the second target: its cluster label moves to ray_io_cluster.
            {"source_labels": ["cluster"], "regex": f"({KUBERAY_CLUSTER})", "target_label": "ray_io_cluster"},
            {"source_labels": ["ray_io_cluster"], "regex": ".+", "target_label": "cluster", "replacement": ""},
            {"source_labels": ["ray_io_cluster"], "regex": ".+", "target_label": "instance",
             "replacement": f"{target}-kuberay"},
        ])
        (base / "prometheus").mkdir()
        process, running = start_prometheus(base / "prometheus", prometheus.render(config))
        started.append(process)
        default, kuberay = f'cluster="{CLUSTER}"', f'ray_io_cluster="{KUBERAY_CLUSTER}", cluster=""'
        wait_until(lambda: len(running.query(f"raypulse_gpu_up{{{default}}}")) == 2
                   and len(running.query(f"raypulse_gpu_up{{{kuberay}}}")) == 2, 60, "both targets scraped")
        time.sleep(7)  # rates over the 4 s rate interval, and a few scrapes of everything
        yield Scene(running, base / "json")
    finally:
        for process in started:
            stop_process(process)
        shutil.rmtree(base, ignore_errors=True)


def _with_data(results: list[livecheck.Result]) -> set[tuple[str, str, str]]:
    return {(r.dashboard, r.panel, r.ref_id) for r in results if r.series}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_kuberay_dashboards_find_the_relabelled_series_as_the_default_ones_find_theirs(scene, capsys):
    def check(variables: dict[str, str], json_dir: Path) -> list[livecheck.Result]:
        return livecheck.run(scene.prometheus.url, variables, window=30, step=2, rate_interval="4s", json_dir=json_dir)

    theirs = check({"cluster": KUBERAY_CLUSTER}, scene.kuberay_json)
    ours = check({"cluster": CLUSTER}, JSON_DIR)
    assert not [r for r in theirs if r.error], [f"{r.name}: {r.error}" for r in theirs if r.error]
    differing = _with_data(theirs) ^ _with_data(ours)
    if differing:  # a value that changed between the two runs (a rate at 0, a fresh counter): ask again
        theirs, ours = check({"cluster": KUBERAY_CLUSTER}, scene.kuberay_json), check(
            {"cluster": CLUSTER}, JSON_DIR)
        differing = {key for key in differing if (key in _with_data(theirs)) != (key in _with_data(ours))}
    assert not differing, sorted(differing)
    shown = _with_data(theirs)
    by_board = {board: sum(1 for key in shown if key[0] == board) for board in ("raypulse-node", "raypulse-gpu")}
    with capsys.disabled():
        print(f"\nlabel contract live check: {len(theirs)} queries of the KubeRay-labelled dashboards, "
              f"{len(shown)} returned data as the default ones did ({by_board})")
    # The node and GPU panels read this exporter: they must show it under ray_io_cluster.
    for board, panel in (("raypulse-gpu", "Utilization"), ("raypulse-gpu", "Temperature"),
                         ("raypulse-gpu", "GPUs answering"), ("raypulse-node", "Load average")):
        assert any(key[:2] == (board, panel) for key in shown), (board, panel)
    assert by_board["raypulse-gpu"] >= 40, by_board
    assert by_board["raypulse-node"] >= 40, by_board
