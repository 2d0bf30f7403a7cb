"""How much of the metric catalog someone looks at: the share of families that appear in at
least one dashboard query (dashboards/json/) or alert rule (alerts/rules/*.yaml).

    python -m dashboards.coverage            # summary and the families nobody reads
    python -m dashboards.coverage --json     # the same as JSON

A family counts as covered when a query or rule expression selects it by name. "Purely
informational" families (type info: identity labels to join on, such as raypulse_gpu_info) are
reported apart; the target is that every other family is covered.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from dashboards import promql
from dashboards.provisioner import JSON_DIR
from dashboards.selectors import ALERT_RULES, catalog


def dashboard_expressions(json_dir: Path = JSON_DIR) -> list[str]:
    expressions = []
    for path in sorted(json_dir.glob("*.json")):
        dashboard = json.loads(path.read_text())
        expressions += [target["expr"] for _, target in promql.iter_targets(dashboard)]
        for variable in dashboard.get("templating", {}).get("list", []):
            selector = promql.label_values_selector(str(variable.get("query") or ""))
            if selector:
                expressions.append(selector)
    return expressions


def alert_expressions(rules_dir: Path = ALERT_RULES) -> list[str]:
    expressions = []
    # The default rule files (*.yaml) only: the opt-in dcgm-compat.yml translates families, it reads none.
    for path in sorted(rules_dir.glob("*.yaml")):
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            expressions += [str(rule["expr"]) for rule in group.get("rules", [])]
    return expressions


def _used(expressions: list[str]) -> set[str]:
    used: set[str] = set()
    for expr in expressions:
        used |= promql.metrics(expr)
    return used


@dataclass
class Coverage:
    families: int
    informational: int
    in_dashboards: int
    in_alerts: int
    covered: int
    share: float  # covered / families
    share_not_informational: float  # the target: 1.0
    uncovered: list[str]  # not informational and read by nothing
    uncovered_informational: list[str]

    def summary(self) -> str:
        lines = [f"metric families: {self.families} ({self.informational} informational)",
                 f"in a dashboard: {self.in_dashboards}; in an alert rule: {self.in_alerts}; in either: "
                 f"{self.covered} = {self.share:.1%}",
                 f"coverage of families that are not purely informational: {self.share_not_informational:.1%}"]
        if self.uncovered:
            lines.append("not in any dashboard or alert: " + ", ".join(self.uncovered))
        if self.uncovered_informational:
            lines.append("informational, not shown: " + ", ".join(self.uncovered_informational))
        return "\n".join(lines)


def measure(json_dir: Path = JSON_DIR, rules_dir: Path = ALERT_RULES) -> Coverage:
    specs = catalog()
    dashboards, alerts = _used(dashboard_expressions(json_dir)), _used(alert_expressions(rules_dir))
    informational = {name for name, spec in specs.items() if spec.type == "info"}
    covered = (dashboards | alerts) & set(specs)
    others = set(specs) - informational
    return Coverage(
        families=len(specs), informational=len(informational),
        in_dashboards=len(dashboards & set(specs)), in_alerts=len(alerts & set(specs)), covered=len(covered),
        share=len(covered) / len(specs), share_not_informational=len(covered & others) / len(others),
        uncovered=sorted(others - covered), uncovered_informational=sorted(informational - covered))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = measure()
    print(json.dumps(asdict(result), indent=2) if args.json else result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
