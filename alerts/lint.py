"""The monitoring-mixins conventions for rule files, as mixtool's `lint` checks them (pkg/mixer/lint.go),
plus raypulse's own: a shared name prefix, a scope label, a runbook link into docs/runbooks.md,
and recording-rule names of the `level:metric:operations` form.

    problems = lint(yaml.safe_load(Path("alerts/rules/gpu.yaml").read_text()))
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from alerts.model import SCOPES, SEVERITIES

PREFIX = "Raypulse"
CAMEL_CASE = re.compile(r"^([A-Z]+[a-z0-9]+)+$")  # mixtool alert-name-camelcase
SUMMARY_STYLE = re.compile(r"^[A-Z].+\.$")  # mixtool alert-summary-style
RECORD_NAME = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")
# Alerts allowed to break a rule, with the reason (mixtool's .lint exclusions).
EXCLUSIONS = {("RaypulseWatchdog", "alert-severity-rule"): "a dead man's switch has no severity to route on"}


def _templated(text: str) -> bool:
    return "{{" in text and "}}" in text


def lint_alert(rule: dict[str, Any], runbook_base: str) -> Iterable[tuple[str, str]]:
    """(rule id, problem) for one alerting rule."""
    name = rule.get("alert", "")
    labels, annotations = rule.get("labels") or {}, rule.get("annotations") or {}
    if not CAMEL_CASE.match(name):
        yield "alert-name-camelcase", f"name {name!r} is not CamelCase"
    if not name.startswith(PREFIX):
        yield "alert-name-prefix", f"name {name!r} does not start with {PREFIX}"
    if labels.get("severity") not in SEVERITIES:
        yield "alert-severity-rule", f"severity {labels.get('severity')!r} is not one of {', '.join(SEVERITIES)}"
    if labels.get("scope") not in SCOPES:
        yield "alert-scope-rule", f"scope {labels.get('scope')!r} is not one of {', '.join(SCOPES)}"
    for key, value in labels.items():
        if _templated(str(value)):
            yield "alert-label-templating", f"label {key} is templated (it would split the alert's identity)"
    description, summary = annotations.get("description"), annotations.get("summary")
    if not description:
        yield "alert-description-missing-rule", "no description"
    elif not _templated(description):
        yield "alert-description-templating", "description has no {{ ... }} to say where the problem is"
    if not summary:
        yield "alert-summary-missing-rule", "no summary"
    else:
        if _templated(summary):
            yield "alert-summary-templating", "summary is templated (it must read the same for every alert)"
        if not SUMMARY_STYLE.match(summary):
            yield "alert-summary-style", f"summary {summary!r} must start with a capital and end with a period"
    runbook = annotations.get("runbook_url", "")
    if runbook != f"{runbook_base}#{name.lower()}":
        yield "alert-runbook-url", f"runbook_url {runbook!r} is not {runbook_base}#{name.lower()}"


def lint(rule_file: dict[str, Any], runbook_base: str) -> list[str]:
    """Every problem in one parsed rule file, as `group/rule: [id] problem`."""
    problems = []
    for group in rule_file.get("groups", []):
        for rule in group.get("rules", []):
            if "alert" in rule:
                for rule_id, problem in lint_alert(rule, runbook_base):
                    if (rule["alert"], rule_id) not in EXCLUSIONS:
                        problems.append(f"{group['name']}/{rule['alert']}: [{rule_id}] {problem}")
            elif not RECORD_NAME.match(rule.get("record", "")):
                problems.append(f"{group['name']}/{rule.get('record')}: [record-name] not level:metric:operations")
    return problems
