"""Coming from dcgm-exporter (alerts/dcgm_compat.py): the migration doc and the opt-in rule file are what
the table generates; every raypulse family they name is in the exporter's catalog with the labels they
select on; the rules are promtool-clean, unit-tested name by name, and never among the default rule
files; and on a real exporter with simulated GPUs, a real Prometheus records dcgm-exporter's names
with its labels and units."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from alerts import build, dcgm_compat, prometheus
from exporter.framework.catalog import CATALOG, MetricSpec
from exporter.framework.collector import load_collectors
from tests.conftest import REPO, binary, exporter_command, wait_until

UNIT_TEST = REPO / "alerts" / "tests" / "dcgm_compat_test.yaml"
TARGET_LABELS = {"job", "instance", "cluster", "node", "role", "ray_node_id"}  # what Prometheus and /sd add
# A family name, not a prefix such as `raypulse_gpu_mig_*`.
FAMILY = re.compile(r"\braypulse_[a-z0-9_]+(?![\w*])")


def catalog() -> dict[str, MetricSpec]:
    load_collectors()  # as dashboards/selectors.py does: every collector declares its families on import
    return {spec.name: spec for spec in CATALOG}


def rule_exprs() -> dict[str, str]:
    groups = yaml.safe_load(dcgm_compat.RULES.read_text())["groups"]
    return {rule["record"]: rule["expr"] for group in groups for rule in group["rules"]}


def texts() -> list[str]:
    """Everything that names raypulse series: the rule expressions and the migration doc."""
    return [*rule_exprs().values(), dcgm_compat.render_doc()]


def test_committed_files_are_what_the_table_generates():
    for path, text in dcgm_compat.outputs().items():
        assert path.read_text() == text, f"{path.relative_to(REPO)} is out of date: run `make alerts`"
    assert {dcgm_compat.RULES, dcgm_compat.DOC} <= set(build.outputs())  # `make alerts` writes them too


def test_every_family_named_is_in_the_exporter_catalog():
    known = catalog()
    named = {name for text in texts() for name in FAMILY.findall(text)}
    named |= {field.family for field in dcgm_compat.FIELDS if field.family}
    assert len(named) > 30
    assert not sorted(named - set(known)), "renamed or removed from the exporter? fix alerts/dcgm_compat.py"


def test_every_label_selected_joined_or_dropped_is_one_the_family_has():
    known = catalog()
    problems = []
    for text in texts():
        # family{label="value", ...} in PromQL, and family{label} in the doc's notes
        for name, body in re.findall(r"\b(raypulse_[a-z0-9_]+)\{([^}]*)\}", text):
            used = {re.match(r"\s*(\w+)", item).group(1) for item in body.split(",") if item.strip()}
            problems += [f"{name} has no label {label}" for label in used - set(known[name].labels)]
        for labels, name in re.findall(r"without \(([^)]*)\) \((?:rate\()?(raypulse_[a-z0-9_]+)", text):
            dropped = {label.strip() for label in labels.split(",")}
            problems += [f"{name} has no label {label} to drop" for label in dropped - set(known[name].labels)]
    for field in dcgm_compat.recorded():  # the identity join matches on gpu and uuid
        for name in FAMILY.findall(str(field.promql)):
            problems += [f"{field.name}: {name} lacks {label}" for label in ("gpu", "uuid")
                         if label not in known[name].labels]
    identity = rule_exprs()[dcgm_compat.IDENTITY]
    sources = set(re.findall(r'"[^"]*", "[^"]*", "(\w+)", "[^"]*"\)', identity))
    assert sources == {"uuid", "gpu", "name", "driver_version", "instance", "node"}
    info = set(known["raypulse_gpu_info"].labels) | TARGET_LABELS
    problems += [f"raypulse_gpu_info has no label {label}" for label in sources - info]
    assert "pci_bus_id" in info
    assert not problems, "\n".join(problems)


def test_every_field_has_promql_or_says_why_not():
    names = [field.name for field in dcgm_compat.FIELDS]
    assert len(names) == len(set(names))
    for field in dcgm_compat.FIELDS:
        assert field.set in dcgm_compat.SETS, field.name
        if field.family is None:
            assert field.note.startswith("None:"), f"{field.name}: say why raypulse has no equivalent"
        if field.family is not None and not field.record:
            assert field.note, f"{field.name}: say why there is no compat rule"


def test_the_compat_rules_are_opt_in():
    path = dcgm_compat.RULES.resolve()
    assert path.suffix == ".yml"
    assert path not in prometheus.rule_files()
    assert str(path) not in prometheus.config(targets=["127.0.0.1:9477"])["rule_files"]
    assert path.name not in build.rule_files()  # nor in the drill's scaled rules
    assert "dcgm-compat.yml" not in (REPO / "alerts" / "tests" / "gpu_test.yaml").read_text()


def test_promtool_check_rules_is_clean():
    result = subprocess.run([binary("promtool"), "check", "rules", "--lint=all", "--lint-fatal",
                             str(dcgm_compat.RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(dcgm_compat.recorded()) + 1} rules found" in result.stdout


def test_every_recorded_name_has_a_promtool_unit_test():
    """tests/test_alerts_rules.py runs alerts/tests/*_test.yaml, this file's tests among them."""
    tests = yaml.safe_load(UNIT_TEST.read_text())
    assert tests["rule_files"] == ["../rules/dcgm-compat.yml"]
    asserted = UNIT_TEST.read_text()
    missing = [name for name in rule_exprs() if name != dcgm_compat.IDENTITY and name not in asserted]
    assert not missing, f"no promtool expectation for {missing}"


@pytest.mark.slow
def test_a_real_prometheus_records_dcgm_names_from_a_simulated_exporter(start_exporter, start_prometheus,
                                                                         tmp_path: Path):
    control = tmp_path / "gpus.json"
    exporter = start_exporter("--simulate-gpus", "2", "--gpu-control", str(control),
                              env={"RAYPULSE_EXPORTER_COLLECTORS__GPU__INTERVAL_SECONDS": "0.5",
                                   "RAYPULSE_EXPORTER_COLLECTORS__GPU_EVENTS__INTERVAL_SECONDS": "0.5"})
    # XID 13 (an application error): XID 79 would take the simulated GPU off the bus, and its series with it
    fault = subprocess.run(exporter_command("gpu-fault", "--control", str(control), "--gpu", "1", "xid", "13"),
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert fault.returncode == 0, fault.stderr
    target = exporter.url.removeprefix("http://")
    config = prometheus.config(targets=[(target, {"node": "worker-1"})], labels={"cluster": "c1"},
                               scrape_interval="1s", rules=[dcgm_compat.RULES.resolve()])
    prom = start_prometheus(prometheus.render(config))

    def value(promql: str) -> float | None:
        result = prom.query(promql)
        return float(result[0]["value"][1]) if result else None

    wait_until(lambda: value('DCGM_FI_DEV_XID_ERRORS{gpu="1"}') == 13
               and value("count(DCGM_FI_PROF_SM_ACTIVE)") == 2
               and value("count(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL)") == 2, 60, "the compat rules to record")

    exported = set(FAMILY.findall(exporter.metrics_text()))
    checked = 0
    for field in dcgm_compat.recorded():
        if not set(FAMILY.findall(str(field.promql))) <= exported:
            continue  # a family this simulated H100 lacks (NVENC, page retirement)
        series = prom.query(field.name)
        assert len(series) == 2, (field.name, series)
        for item in series:
            labels = item["metric"]
            gpu = labels["gpu"]
            assert labels["UUID"] == labels["uuid"]
            assert labels["device"] == f"nvidia{gpu}"
            assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
            assert labels["Hostname"] == "worker-1"
            assert labels["pci_bus_id"], labels
            assert labels["DCGM_FI_DRIVER_VERSION"], labels
        checked += 1
    assert checked >= 40
    # dcgm-exporter's units on live values: MHz, W, MiB, percent
    assert 100 < value("min(DCGM_FI_DEV_SM_CLOCK)") < 5000
    assert 10 < value("min(DCGM_FI_DEV_POWER_USAGE)") < 2000
    assert 40_000 < value("min(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)") < 200_000
    assert 0 <= value("max(DCGM_FI_DEV_GPU_UTIL)") <= 100
    assert value('DCGM_FI_DEV_XID_ERRORS{gpu="0", err_code="0"}') == 0
    # NVIDIA's dashboard 12239 queries, as written there
    for query in ('DCGM_FI_DEV_GPU_TEMP{instance=~".*", gpu=~".*"}', "sum(DCGM_FI_DEV_POWER_USAGE)",
                  "DCGM_FI_DEV_SM_CLOCK * 1000000", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"):
        assert prom.query(query), query


def test_beside_a_dcgm_exporter_no_name_has_two_series_for_one_gpu(tmp_path: Path):
    """Every recorded name, reported by a dcgm-exporter for GPU-0 too (its GPU id and Hostname unlike
    raypulse's, as they may be): promtool finds one series per GPU and name, dcgm-exporter's for GPU-0."""
    tests = yaml.safe_load(UNIT_TEST.read_text())
    inputs = tests["tests"][0]["input_series"]  # every raypulse input, GPUs 0 and 1
    assert 'uuid="GPU-0"' in inputs[0]["series"]
    names = [name for name in rule_exprs() if name != dcgm_compat.IDENTITY]
    dcgm = [{"series": f'{name}{{job="dcgm-exporter",instance="10.0.0.5:9400",gpu="7",UUID="GPU-0",'
                       f'device="nvidia7",modelName="NVIDIA H100 80GB HBM3",Hostname="ip-10-0-0-5"}}',
             "values": "1x10"} for name in names]
    per_gpu = ('count by (__name__, gpu_uuid) (label_replace(label_replace({__name__=~"DCGM_.*"}, '
               '"gpu_uuid", "$1", "uuid", "(.+)"), "gpu_uuid", "$1", "UUID", "(.+)"))')
    test = {
        "rule_files": [str(dcgm_compat.RULES.resolve())],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [*inputs, *dcgm], "promql_expr_test": [
            {"expr": f"{per_gpu} > 1", "eval_time": "2m", "exp_samples": []},
            # GPU-0's series of every name is dcgm-exporter's own
            {"expr": 'count by (__name__) ({__name__=~"DCGM_.*", UUID="GPU-0", job!="dcgm-exporter"})',
             "eval_time": "2m", "exp_samples": []},
            {"expr": 'count({__name__=~"DCGM_.*", UUID="GPU-0", job="dcgm-exporter"})', "eval_time": "2m",
             "exp_samples": [{"labels": "{}", "value": len(names)}]},
        ]}],
    }
    path = tmp_path / "beside_dcgm_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False, width=4096))
    result = subprocess.run([binary("promtool"), "test", "rules", path.name], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
