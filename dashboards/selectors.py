"""The dashboard variables and the one way panels write a series selector.

Every series raypulse exports carries, besides its own labels, the target labels that the head
exporter's `/sd` gives each node's exporter (`cluster`, `node`, `role`, `ray_node_id`) and
Prometheus's `job` and `instance`. A Scope is the set of variables a dashboard has; calling it
with a family name writes that family's selector with a matcher for every variable whose label
the family carries (read from the metric catalog), so a panel can neither forget `$cluster` nor
filter a family by a label it does not have. An unknown family name fails the build: the
catalog, not the dashboards, decides what exists. The same holds for the recorded series of the
rule files (alerts/rules/*.yaml, e.g. the pre-aggregations of scale.yaml): their labels are those
of the rule's `by (...)`, read from the file, so a renamed record or label fails the build too.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from exporter.contract import node_exporter, vllm
from exporter.framework.catalog import CATALOG, MetricSpec
from exporter.framework.collector import load_collectors

# Labels Prometheus attaches to every series it scrapes from our exporters (see exporter/collectors/ray/sd.py).
TARGET_LABELS = frozenset({"job", "instance", "cluster", "node", "role", "ray_node_id"})
# Series that are not ours but that dashboards read: Prometheus's own, with the labels we filter on.
# ALERTS keeps the labels of the alert's expression; ours keep these where the expression has them.
# node_exporter's get the same target labels from /sd (exporter/contract/node_exporter.py), vLLM's
# engines' the same from /sd/ray (exporter/contract/vllm.py).
FOREIGN = {"up": TARGET_LABELS,
           "ALERTS": frozenset({"cluster", "node", "gpu", "submission_id", "alertname", "alertstate", "severity",
                                "scope"}),
           **{name: labels | TARGET_LABELS for name, labels in node_exporter.FAMILIES.items()},
           **{name: labels | TARGET_LABELS for name, labels in vllm.FAMILIES.items()}}


# raypulse's rule files (package data beside this package; read, not imported: dashboards/ and
# alerts/ do not import each other). `*.yaml` only: the opt-in dcgm-compat.yml is loaded by nobody by default.
ALERT_RULES = Path(__file__).resolve().parent.parent / "alerts" / "rules"
_AGGREGATED_BY = re.compile(r"\s*(?:sum|count|min|max|group)\s+by\s*\(([^)]*)\)")


@dataclass(frozen=True)
class Variable:
    name: str
    label: str  # shown in Grafana
    series_label: str  # the label it filters
    query: str  # label_values(...) feeding its options
    description: str


VARIABLES = {v.name: v for v in (
    Variable("cluster", "Cluster", "cluster", "label_values(raypulse_exporter_build_info, cluster)",
             "Ray cluster: the `cluster` label the head exporter's /sd gives every node's exporter."),
    Variable("node", "Node", "node", 'label_values(raypulse_exporter_build_info{cluster=~"$cluster"}, node)',
             "Ray node (the `node` label from /sd: the launcher's node name or the node IP)."),
    # Not `job`: that is Prometheus's scrape-job label, and a link or a reader would take one for the other.
    Variable("submission", "Submission", "submission_id",
             'label_values(raypulse_job_info{cluster=~"$cluster"}, submission_id)',
             "Ray job by submission id (one per launcher attempt: <run id>-<attempt>)."),
    Variable("gpu", "GPU", "gpu", 'label_values(raypulse_gpu_info{cluster=~"$cluster", node=~"$node"}, gpu)',
             "GPU index on the node (NVML index); `uuid` tells GPUs of different nodes apart."),
)}


@functools.cache
def catalog() -> dict[str, MetricSpec]:
    """Every family the exporter declares, by name."""
    load_collectors()
    return {spec.name: spec for spec in CATALOG}


@functools.cache
def records(rules_dir: Path = ALERT_RULES) -> dict[str, frozenset[str]]:
    """Every recording rule of the rule files whose expression is an aggregation `by (...)`, with
    those labels: what its series carry on the Prometheus that records it (a store adds the
    external labels, e.g. the shard's; panels sum those away)."""
    found: dict[str, frozenset[str]] = {}
    for path in sorted(rules_dir.glob("*.yaml")):
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            for rule in group.get("rules", []):
                match = _AGGREGATED_BY.match(str(rule["expr"])) if "record" in rule else None
                if match:
                    found[rule["record"]] = frozenset(label.strip() for label in match.group(1).split(",")
                                                      if label.strip())
    return found


def series_labels(metric: str) -> frozenset[str]:
    """The labels a stored series of `metric` has (its own and the scrape's; a record's `by` labels)."""
    if metric in FOREIGN:
        return FOREIGN[metric]
    if metric in records():
        return records()[metric]
    spec = catalog().get(metric)
    if spec is None:
        raise KeyError(f"{metric} is neither in the metric catalog (`exporter metrics`) nor recorded by an "
                       f"aggregation in {ALERT_RULES}; was it renamed?")
    return frozenset(spec.labels) | TARGET_LABELS


class Scope:
    """`Scope("cluster", "node")("raypulse_node_load1")` ->
    `raypulse_node_load1{cluster=~"$cluster", node=~"$node"}`. Extra matchers are raw PromQL
    (`'mode!~"idle|iowait"'`) or keyword equalities (`sensor="gpu"`)."""

    def __init__(self, *variables: str) -> None:
        unknown = [name for name in variables if name not in VARIABLES]
        if unknown:
            raise ValueError(f"unknown dashboard variables {unknown}; known: {sorted(VARIABLES)}")
        self.variables = variables

    def __call__(self, metric: str, *matchers: str, **equals: str) -> str:
        labels = series_labels(metric)
        parts = [f'{VARIABLES[v].series_label}=~"${v}"' for v in self.variables
                 if VARIABLES[v].series_label in labels]
        parts += list(matchers) + [f'{key}="{value}"' for key, value in equals.items()]
        for part in parts[len(parts) - len(matchers) - len(equals):]:
            name = part.split("=")[0].split("!")[0].strip()
            if name not in labels:
                raise ValueError(f"{metric} has no label {name!r} (labels: {sorted(labels)})")
        return f"{metric}{{{', '.join(parts)}}}"
