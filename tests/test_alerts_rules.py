"""The alert rules: generated files up to date, promtool-clean, unit-tested alert by alert, following
the mixin conventions, linked to a runbook section, and written over metrics the exporter has."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from alerts import build, lint, prometheus
from alerts.config import DEFAULT, Duration, d
from tests.conftest import REPO, binary

# The rule files loaded by default, and the opt-in Watchdog (checked like them).
RULES = [*sorted((REPO / "alerts" / "rules").glob("*.yaml")), REPO / "alerts" / "rules" / "watchdog.yml"]
UNIT_TESTS = sorted((REPO / "alerts" / "tests").glob("*_test.yaml"))
RUNBOOKS = REPO / "docs" / "runbooks.md"
ALWAYS_FIRING = {"RaypulseWatchdog"}  # the dead man's switch has no quiet case by design


def rule_docs() -> dict[Path, dict]:
    return {path: yaml.safe_load(path.read_text()) for path in RULES}


def alerting_rules() -> list[dict]:
    return [rule for doc in rule_docs().values() for group in doc["groups"] for rule in group["rules"]
            if "alert" in rule]


def test_committed_files_are_what_the_builder_writes():
    stale = [str(path.relative_to(REPO)) for path in build.stale_outputs()]
    assert not stale, f"out of date (run `make alerts`): {stale}"


def test_promtool_check_rules_is_clean():
    result = subprocess.run([binary("promtool"), "check", "rules", "--lint=all", "--lint-fatal", *map(str, RULES)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sum("SUCCESS" in line for line in result.stdout.splitlines()) == len(RULES)


def test_promtool_unit_tests_pass():
    result = subprocess.run([binary("promtool"), "test", "rules", *[path.name for path in UNIT_TESTS]],
                            cwd=REPO / "alerts" / "tests", capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    fired: dict[str, set[str]] = defaultdict(set)  # alertname -> severities seen firing
    quiet: set[str] = set()
    for path in UNIT_TESTS:
        for group in yaml.safe_load(path.read_text())["tests"]:
            # promtool 2.42 silently evaluates a group without `interval` at the wrong step
            assert "interval" in group, f"{path.name}: test {group.get('name')!r} has no interval"
            for case in group.get("alert_rule_test", []):
                if case["exp_alerts"]:
                    fired[case["alertname"]].update(alert["exp_labels"]["severity"] for alert in case["exp_alerts"])
                else:
                    quiet.add(case["alertname"])
    missing = []
    for rule in alerting_rules():
        name, severity = rule["alert"], rule["labels"]["severity"]
        if severity not in fired[name]:
            missing.append(f"{name} ({severity}) never fires in a test")
        if name not in quiet and name not in ALWAYS_FIRING:
            missing.append(f"{name} has no case where it must stay quiet")
    assert not missing, "\n".join(missing)


def test_rules_follow_the_mixin_conventions():
    problems = [problem for doc in rule_docs().values() for problem in lint.lint(doc, DEFAULT.runbook_base)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("rule", "expected"), [
    ({"alert": "raypulse_gpu_lost"}, "alert-name-camelcase"),
    ({"alert": "GpuLost"}, "alert-name-prefix"),
    ({"labels": {"severity": "page"}}, "alert-severity-rule"),
    ({"annotations": {"summary": "GPU {{ $labels.gpu }} lost."}}, "alert-summary-templating"),
    ({"annotations": {"summary": "a GPU is lost"}}, "alert-summary-style"),
    ({"annotations": {"description": "A GPU is lost."}}, "alert-description-templating"),
    ({"annotations": {"runbook_url": "https://example.com/"}}, "alert-runbook-url"),
    ({"labels": {"severity": "warning", "scope": "{{ $labels.node }}"}}, "alert-scope-rule"),
])
def test_lint_catches_each_convention_break(rule, expected):
    good = {"alert": "RaypulseGpuLost", "expr": "raypulse_gpu_up == 0",
            "labels": {"severity": "critical", "scope": "gpu"},
            "annotations": {"summary": "A GPU is lost.", "description": "GPU {{ $labels.gpu }} is lost.",
                            "runbook_url": "https://x/runbooks.md#raypulsegpulost"}}
    assert lint.lint({"groups": [{"name": "g", "rules": [good]}]}, "https://x/runbooks.md") == []
    bad = {**good, **{key: {**good.get(key, {}), **value} if isinstance(value, dict) else value
                      for key, value in rule.items()}}
    problems = lint.lint({"groups": [{"name": "g", "rules": [bad]}]}, "https://x/runbooks.md")
    assert any(f"[{expected}]" in problem for problem in problems), problems


def test_every_alert_has_a_runbook_section_with_meaning_confirmation_and_action():
    text = RUNBOOKS.read_text()
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S))
    for rule in alerting_rules():
        name = rule["alert"]
        assert name in sections, f"docs/runbooks.md has no section '## {name}'"
        for part in ("**Meaning**", "**Confirm**", "**Act**"):
            assert part in sections[name], f"runbook section {name} lacks {part}"
        assert rule["annotations"]["runbook_url"].endswith(f"#{name.lower()}")  # GitHub's anchor for the heading


def test_rules_read_only_metrics_the_exporter_has():
    catalog = json.loads(subprocess.run([sys.executable, "-m", "exporter", "metrics", "-o", "json"],
                                        cwd=REPO, capture_output=True, text=True, check=True).stdout)
    names = {family["name"] for family in catalog}
    used = set()
    for doc in rule_docs().values():
        for group in doc["groups"]:
            for rule in group["rules"]:
                used |= set(re.findall(r"(?<![\w:])raypulse_[a-z0-9_]+(?![\w:])", rule["expr"]))
    unknown = sorted(used - names)
    assert not unknown, f"rules use metrics the exporter catalog lacks (renamed?): {unknown}"


def test_the_drill_variant_is_the_same_rules_with_scaled_durations(tmp_path):
    scaled = DEFAULT.scaled(1 / 30)
    build.write_rules(tmp_path, scaled)
    result = subprocess.run([binary("promtool"), "check", "rules", *map(str, sorted(tmp_path.glob("*.yaml")))],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr

    def shape(doc: dict) -> list[tuple]:
        # durations and age thresholds are the only things that change, with the window that ends a
        # recording rule's name (level:metric:rate5m)
        durations = re.compile(r"\b\d+(?:[dhms]\d*)*[dhms]?\b")

        def normal(text: str) -> str:
            return durations.sub("N", re.sub(r"(:[a-z_]+?)\d+(?:[dhms]\d*)*[dhms]\b", r"\1N", text))
        return [(normal(rule.get("alert") or rule["record"]), normal(rule["expr"]), rule.get("labels"))
                for group in doc["groups"] for rule in group["rules"]]

    for path in RULES:
        assert shape(yaml.safe_load((tmp_path / path.name).read_text())) == shape(yaml.safe_load(path.read_text()))
    assert scaled.tune("RaypulseGpuNvmlDown").for_ == Duration(10)  # 5m / 30
    assert scaled.tune("RaypulseGpuXidCritical").for_ == Duration(0)  # immediate stays immediate
    assert scaled.tune("RaypulseNodeOomKills").window == Duration(30)  # 15m / 30
    assert scaled.tune("RaypulseGpuNvlinkErrors").errors == 10  # thresholds that are not durations stay


@pytest.mark.parametrize(("text", "seconds"), [("0s", 0), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("2d", 172800)])
def test_durations_read_and_write_like_prometheus(text, seconds):
    assert d(text).seconds == seconds
    assert str(d(text)) == ("1m30s" if text == "90s" else text)


def test_a_scaled_window_keeps_enough_samples():
    assert d("10m").scaled(1 / 100, floor=15) == Duration(15)
    with pytest.raises(ValueError, match="not a duration"):
        d("5 minutes")


def test_the_unit_tests_notice_a_moved_threshold(tmp_path):
    """The promtool tests pin behaviour, not just syntax: the same tests on rules built with one
    threshold raised (thermal slowdown at 90% of the time instead of 10%) must fail."""
    tuning = dict(DEFAULT.tuning)
    thermal = tuning["RaypulseGpuThermalSlowdown"]
    tuning["RaypulseGpuThermalSlowdown"] = dataclasses.replace(thermal, ratio=0.9)
    build.write_rules(tmp_path / "rules", dataclasses.replace(DEFAULT, tuning=tuning))
    (tmp_path / "tests").mkdir()
    test_file = tmp_path / "tests" / "gpu_test.yaml"
    test_file.write_text((REPO / "alerts" / "tests" / "gpu_test.yaml").read_text())
    result = subprocess.run([binary("promtool"), "test", "rules", test_file.name], cwd=test_file.parent,
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "RaypulseGpuThermalSlowdown" in result.stdout + result.stderr


def _alert_names(files: dict[str, str]) -> dict[str, set[str]]:
    return {name: {rule["alert"] for group in yaml.safe_load(text)["groups"] for rule in group["rules"]
                   if "alert" in rule} for name, text in files.items()}


def test_the_watchdog_is_opt_in_and_turned_on_by_config(tmp_path):
    """kube-prometheus-stack has its own Watchdog (its Alertmanager routes only that one to its null
    receiver): ours is left out of the default rule files, written as the opt-in watchdog.yml."""
    assert all("RaypulseWatchdog" not in names for names in _alert_names(build.rule_files()).values())
    assert _alert_names(build.opt_in_files()) == {"watchdog.yml": {"RaypulseWatchdog"}}
    assert not any("Watchdog" in path.read_text() for path in prometheus.rule_files())
    on = dataclasses.replace(DEFAULT, watchdog=True)
    assert _alert_names(build.rule_files(on))["watchdog.yaml"] == {"RaypulseWatchdog"}
    assert build.opt_in_files(on) == {}
    # a setup without kps asks for it: the committed opt-in file, or the one a --watchdog build loads anyway
    assert prometheus.rule_files(watchdog=True)[-1] == (REPO / "alerts" / "rules" / "watchdog.yml").resolve()
    build.write_rules(tmp_path / "on", dataclasses.replace(DEFAULT, watchdog=True))
    assert prometheus.rule_files(tmp_path / "on", watchdog=True) == prometheus.rule_files(tmp_path / "on")
    (tmp_path / "none").mkdir()
    with pytest.raises(FileNotFoundError, match=r"watchdog\.yml is missing"):
        prometheus.rule_files(tmp_path / "none", watchdog=True)
    assert build.main(["--watchdog", "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "watchdog.yaml").exists()
    assert not (tmp_path / "cli" / "watchdog.yml").exists()


def test_exporter_down_is_a_kps_like_warning_and_a_test_can_shorten_its_for():
    rule = next(rule for rule in alerting_rules() if rule["alert"] == "RaypulseExporterDown")
    assert (rule["labels"]["severity"], rule["for"]) == ("warning", "10m")  # kps' TargetDown: warning after 10m
    fast = DEFAULT.with_fors({"RaypulseExporterDown": "1m"})
    assert fast.tune("RaypulseExporterDown").for_ == d("1m")
    assert fast.scaled(1 / 30).tune("RaypulseExporterDown").for_ == Duration(2)
    assert {key: tune for key, tune in fast.tuning.items() if key != "RaypulseExporterDown"} == \
        {key: tune for key, tune in DEFAULT.tuning.items() if key != "RaypulseExporterDown"}
    with pytest.raises(KeyError, match="no entry 'RaypulseNoSuchAlert'"):
        DEFAULT.with_fors({"RaypulseNoSuchAlert": "1m"})


def test_job_and_training_alerts_keep_the_namespace():
    """kube-prometheus-stack groups and inhibits by `namespace`: every aggregation of a job or training
    alert keeps it (the promtool cases in jobs_test.yaml and training_test.yaml show it on the alert)."""
    for rule in alerting_rules() + [rule for doc in rule_docs().values() for group in doc["groups"]
                                    for rule in group["rules"] if "record" in rule]:
        if rule.get("labels", {}).get("scope") in ("job", "training") or rule.get("record", "").startswith(
                ("ray_job:raypulse_train", "rank:raypulse_train")):
            taken_back = "group_left (namespace)" in rule["expr"]  # from the job's own series (GPU use)
            for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", rule["expr"]):
                assert "namespace" in clause or taken_back, \
                    f"{rule.get('alert') or rule['record']}: by ({clause}) drops namespace"
