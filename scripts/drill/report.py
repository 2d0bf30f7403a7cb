"""The drill's results as Markdown (docs/alerts-drill.md)."""

from __future__ import annotations

from scripts.drill.faults import QUICK
from scripts.drill.run import COLLECTOR_INTERVALS, GROUPING, SCALE, SCRAPE_SECONDS, SLACK_SECONDS, Outcome, Report

# Labels worth showing in the table (the rest: job, instance, severity, scope, uuid ...).
SHOWN = ("node", "gpu", "xid", "call", "collector", "submission_id", "rank")


def _labels(labels: dict[str, str] | None) -> str:
    if not labels:
        return "—"
    shown = [f"{key}={labels[key]}" for key in SHOWN if labels.get(key)]
    return f"`{labels.get('alertname')}` " + ", ".join(shown) + f" ({labels.get('severity')})"


def render(report: Report) -> str:
    lines = [
        "# Alert fault drill",
        "",
        "<!-- Written by `make drill` (python -m scripts.drill --output docs/alerts-drill.md); do not edit. -->",
        "",
        "A real local Ray cluster started by the launcher (a head, `gpu-1` with 16 simulated H100s, `cpu-1`), "
        "one exporter per node plus a spare exporter with 2 simulated GPUs, a real Prometheus and Alertmanager "
        "(Debian's 2.42 and 0.25) with the rules of `alerts/rules/` and `alerts/alertmanager.yml`, and a real "
        "webhook receiver (`scripts/webhook.py`). A training job (`scripts/drill/job.py`, 2 ranks reporting "
        "through `exporter.progress`) runs throughout. First a healthy run that must raise nothing but the "
        "Watchdog, then each fault in turn; the table records which alert reached the webhook, with which "
        "labels, how long after the injection.",
        "",
        f"- Rules: the drill variant, every duration of `alerts/config.py` times {SCALE:.4g} "
        f"(`Config.scaled`, `python -m alerts.build --scale`): `for: 5m` becomes 10s, a 15m window 30s.",
        f"- Scrape and evaluation interval {SCRAPE_SECONDS}s; collectors "
        + ", ".join(f"{name} {seconds}s" for name, seconds in COLLECTOR_INTERVALS.items())
        + f"; Alertmanager group_wait/group_interval {GROUPING}; Ray's node health check 1s x 5.",
        "- The launcher's health watcher runs with every `health.on_*` set to `report`: it sees the same "
        "faults and would otherwise stop the job (`make heal-drill` tests that half; docs/healing-drill.md).",
        f"- Budget of each alert = scrape + evaluation interval + its scaled `for` + the source's own delay "
        f"(collector interval; for a stall, the stall threshold; for a node, Ray's health check) + "
        f"{SLACK_SECONDS:g}s slack.",
        f"- Run: {report.started}, {'the quick subset' if report.quick else 'every fault'}, "
        f"{report.wall_seconds:g}s in all. The e2e test (tests/test_alerts_drill.py) runs the quick subset "
        f"({', '.join(QUICK)}); `make drill` runs every fault.",
        "",
        "## Healthy run",
        "",
        f"{report.healthy_seconds:g}s with the job training: " + healthy_verdict(report.healthy_alerts),
        "",
    ]
    lines += outcome_lines(report.outcomes, report.false_alarms, report.ok, "e.g. NVLink errors when a link goes "
                           "down, a restarted exporter briefly down")
    return "\n".join(lines)


def healthy_verdict(healthy_alerts: list[dict]) -> str:
    return ("**no alert** but the Watchdog." if not healthy_alerts else
            "**alerts fired**: " + "; ".join(_labels(a["labels"]) for a in healthy_alerts))


def outcome_lines(outcomes: list[Outcome], false_alarms: list[dict], ok: bool, side_effects: str) -> list[str]:
    """The faults table, the unexpected alerts and the verdict."""
    lines = ["## Faults", "",
             "| fault | injected | expected alert | received | latency | budget | ok |",
             "|---|---|---|---|---|---|---|"]
    for o in outcomes:
        latency = f"{o.latency:g}s" if o.latency is not None else "—"
        lines.append(f"| {o.fault} | {o.injected} | `{o.expected}` | {_labels(o.received)} | {latency} "
                     f"| {o.budget:g}s | {'yes' if o.ok else '**no**'} |")
    lines += ["", "## Unexpected alerts", ""]
    lines += [f"- {_labels(a['labels'])}" for a in false_alarms] or [
        f"None: every alert that arrived was expected, or a listed true side effect of its fault ({side_effects})."]
    lines += ["", f"Result: **{'OK' if ok else 'FAILED'}**.", ""]
    return lines
