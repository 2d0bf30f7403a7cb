"""The cut: high-cardinality families a large cluster's Prometheus need not store, derived from what
the dashboards (dashboards/json/) and the rules (alerts/rules/*.yaml) query, never from a list kept
by hand (issue 26).

    python -m dashboards.cut            # what the cut drops, and which panel targets go dark
    python -m dashboards.cut --json

Candidates are the per-link families (a `link` label: 18 links x 8 GPUs per node, a third of a node's
series). A candidate is dropped only when
- no alerting or recording rule reads it (alerts keep working: every family a rule reads survives),
- no dashboard variable reads it (the variables keep their options),
- every panel that reads it keeps another query that reads no dropped family (no panel goes empty;
  e.g. "NVLink throughput" keeps the byte counter's rate when the per-link gauges go).
Every catalog family is read by some panel (`python -m dashboards.coverage`: 100%), so this is the
strongest cut that leaves every panel and every rule answering; what it costs is the per-link detail of
the targets listed by `dark_targets`, shown in docs/scale.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from dashboards import promql
from dashboards.coverage import ALERT_RULES, alert_expressions
from dashboards.provisioner import JSON_DIR
from dashboards.selectors import catalog

PER_LINK = "link"  # the label that makes a family per NVLink link


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    expr: str
    families: frozenset[str]


@dataclass(frozen=True)
class Cut:
    dropped: tuple[str, ...]
    kept_candidates: dict[str, str]  # family -> why it stays
    dark_targets: tuple[str, ...]  # "dashboard / panel: expr" of each query that loses its data


def panel_queries(json_dir: Path = JSON_DIR) -> list[Query]:
    queries = []
    for path in sorted(json_dir.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel, target in promql.iter_targets(dashboard):
            expr = str(target.get("expr") or "")
            queries.append(Query(dashboard.get("title", path.stem), str(panel.get("title", "")), expr,
                                 frozenset(promql.metrics(expr))))
    return queries


def variable_families(json_dir: Path = JSON_DIR) -> set[str]:
    families: set[str] = set()
    for path in sorted(json_dir.glob("*.json")):
        for variable in json.loads(path.read_text()).get("templating", {}).get("list", []):
            selector = promql.label_values_selector(str(variable.get("query") or ""))
            if selector:
                families |= promql.metrics(selector)
    return families


def rule_families(rules_dir: Path = ALERT_RULES) -> set[str]:
    families: set[str] = set()
    for expr in alert_expressions(rules_dir):
        families |= promql.metrics(expr)
    return families


def candidates() -> list[str]:
    return sorted(name for name, spec in catalog().items() if PER_LINK in spec.labels)


def derive(json_dir: Path = JSON_DIR, rules_dir: Path = ALERT_RULES) -> Cut:
    queries = panel_queries(json_dir)
    by_panel: dict[tuple[str, str], list[Query]] = {}
    for query in queries:
        by_panel.setdefault((query.dashboard, query.panel), []).append(query)
    ruled, variables = rule_families(rules_dir), variable_families(json_dir)
    dropped: set[str] = set()
    kept: dict[str, str] = {}
    for family in candidates():
        if family in ruled:
            kept[family] = "an alerting or recording rule reads it"
            continue
        if family in variables:
            kept[family] = "a dashboard variable reads it"
            continue
        trial = dropped | {family}
        empty = [f"{dashboard} / {panel}" for (dashboard, panel), panel_queries_ in by_panel.items()
                 if any(family in q.families for q in panel_queries_)
                 and all(q.families & trial for q in panel_queries_)]
        if empty:
            kept[family] = "it is the only data of the panel " + ", ".join(sorted(empty))
            continue
        dropped = trial
    dark = tuple(f"{q.dashboard} / {q.panel}: {q.expr}" for q in queries if q.families & dropped)
    return Cut(tuple(sorted(dropped)), kept, dark)


def relabel_configs(cut: Cut) -> list[dict[str, object]]:
    """metric_relabel_configs dropping the cut's families (after the scrape, before storage)."""
    if not cut.dropped:
        return []
    return [{"source_labels": ["__name__"], "regex": "|".join(cut.dropped), "action": "drop"}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    cut = derive()
    if args.json:
        print(json.dumps(asdict(cut), indent=2))
        return 0
    print("dropped: " + (", ".join(cut.dropped) or "nothing"))
    for family, why in cut.kept_candidates.items():
        print(f"kept: {family}: {why}")
    for target in cut.dark_targets:
        print(f"loses its data: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
