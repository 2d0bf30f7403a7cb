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

from alerts import build, lint
from alerts.config import DEFAULT, Duration, d
from tests.conftest import REPO, binary

RULES = sorted((REPO / "alerts" / "rules").glob("*.yaml"))
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
    catalog = json.loads(subprocess.run([sys.executable, "-m", "exporter", "metrics", "--format", "json"],
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
