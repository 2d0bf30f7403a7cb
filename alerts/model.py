"""Rules as plain data: Alert, Record and Group, and their Prometheus rule-file form.

A group module returns a Group; `Group.render(config)` gives the dict that becomes YAML. The
runbook link is added here, uniformly (`<runbook_base>#<alertname lowercased>`), as
kubernetes-mixin's add-runbook-links does, so no rule spells one out; and here every expression and
annotation goes through the label contract (`config.labels`, exporter/contract/labels.py), so the groups
spell `cluster` and `node` and a contract with other names renames them all.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

from alerts.config import Config, Duration

SEVERITIES = ("critical", "warning", "info")
# What an alert is about; Alertmanager inhibits by it (a node that is down mutes its gpu/job alerts).
SCOPES = ("gpu", "node", "ray", "job", "training", "exporter", "meta")

# Labels that place a per-GPU series (the target's labels plus the GPU's own).
GPU = "cluster, node, instance, job, gpu, uuid"
# Labels of a Ray job across nodes (the Prometheus `job` label is the scrape job, not this): what joins
# a job's series (`on (...)`), wherever they come from, and what the scale records keep.
RAY_JOB = "cluster, job_id, submission_id"
# The target label prometheus-operator adds (the scraped pod's namespace); kube-prometheus-stack's
# Alertmanager groups and inhibits by it. Absent outside Kubernetes, where `by` it changes nothing.
NAMESPACE = "namespace"
# What job and training alerts aggregate by: the job, and its namespace kept. Joins stay `on (RAY_JOB)`:
# a job's series may come from exporters in another namespace (the DaemonSet's, not the job's pods').
BY_JOB = f"cluster, {NAMESPACE}, job_id, submission_id"


def promql(text: str) -> str:
    """A rule expression written as an indented triple-quoted string, without the indentation."""
    return textwrap.dedent(text).strip()


def increased(series: str, window: Duration, up: str) -> str:
    """`series` grew within `window`, including a counter series that was born already above 0.

    increase() needs two samples of a series, so it misses the first error of a counter that only
    appears once something happened. A series born non-zero counts only if its target (`up`) was
    already scraped a window ago: a new target or a restarted Prometheus sees old counts, not news.
    """
    return (f"increase({series}[{window}]) > 0\n"
            f"or\n"
            f"({series} > 0 unless {series} offset {window})\n"
            f"  and on (job, instance) ({up} offset {window})")


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str
    scope: str
    expr: str
    summary: str
    description: str
    tuning_key: str = ""  # defaults to the name

    def render(self, config: Config) -> dict[str, Any]:
        labels = config.labels  # every label name through the contract (exporter/contract/labels.py)
        rule: dict[str, Any] = {"alert": self.name, "expr": labels.promql(promql(self.expr))}
        for_ = config.tune(self.tuning_key or self.name).for_
        if for_.seconds:
            rule["for"] = str(for_)
        rule["labels"] = {"severity": self.severity, "scope": self.scope}
        rule["annotations"] = {
            "summary": labels.template(self.summary),
            "description": labels.template(" ".join(self.description.split())),
            "runbook_url": f"{config.runbook_base}#{self.name.lower()}",
        }
        return rule


@dataclass(frozen=True)
class Record:
    record: str
    expr: str

    def render(self, config: Config) -> dict[str, Any]:
        return {"record": self.record, "expr": config.labels.promql(promql(self.expr))}


@dataclass(frozen=True)
class Group:
    name: str  # also the rule file's name: alerts/rules/<name>.yaml
    title: str  # one line for docs/alerts.md
    rules: list[Alert | Record] = field(default_factory=list)

    @property
    def alerts(self) -> list[Alert]:
        return [rule for rule in self.rules if isinstance(rule, Alert)]

    def render(self, config: Config) -> dict[str, Any]:
        return {"groups": [{"name": f"raypulse-{self.name}", "rules": [rule.render(config) for rule in self.rules]}]}


# Where an alert points, in its description (labels Prometheus keeps on the alert).
AT_NODE = "node {{ $labels.node }} ({{ $labels.instance }}) in cluster {{ $labels.cluster }}"
AT_GPU = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on " + AT_NODE
AT_JOB = "Ray job {{ or $labels.submission_id $labels.job_id }} in cluster {{ $labels.cluster }}"
AT_RANK = "rank {{ $labels.rank }} of " + AT_JOB + " (node {{ $labels.node }})"


def cap(text: str) -> str:
    """A location phrase at the start of a sentence."""
    return text[:1].upper() + text[1:]
