"""The RL drill's results as Markdown (docs/rl-drill.md)."""

from __future__ import annotations

from scripts.drill.report import healthy_verdict, outcome_lines
from scripts.rl_drill.faults import QUICK
from scripts.rl_drill.run import COLLECTOR_INTERVALS, MIN_WINDOW, SCALE, SCRAPE_SECONDS, SLACK_SECONDS, Report


def render(report: Report) -> str:
    lines = [
        "# RL fault drill",
        "",
        "<!-- Written by `make rl-drill` (python -m scripts.rl_drill --output docs/rl-drill.md); do not edit. -->",
        "",
        "RLlib's PPO (examples/rllib_ppo.py's configuration, with raypulse's `RaypulseCallback`; one EnvRunner, "
        "one Learner) submitted by the launcher to a real local Ray cluster (a head, a worker with 2 simulated "
        "GPUs, NVML listing the EnvRunner on GPU 0 and the Learner on GPU 1), a real Prometheus and "
        "Alertmanager with the `rl` alert rules, and a real webhook receiver. The environment is CartPole with "
        "the drill's faults (scripts/rl_drill/job.py). First a healthy run that must raise nothing but the "
        "Watchdog, with every query of the RL post-training board run against it; then each fault in turn.",
        "",
        f"- Rules: `alerts/rules/rl.yaml` with every duration of `alerts/config.py` times {SCALE:.4g}, windows "
        f"at least {MIN_WINDOW}s (`Config.scaled`); scrape and evaluation interval {SCRAPE_SECONDS}s; collectors "
        + ", ".join(f"{name} {seconds}s" for name, seconds in COLLECTOR_INTERVALS.items()) + ".",
        "- The launcher's health watcher only reports (it would stop the hung attempt).",
        f"- Budget of each alert = scrape + evaluation interval + its scaled `for` + the source's own delay "
        f"(the phase-stall age, the slow sync itself, the reward window) + {SLACK_SECONDS:g}s slack.",
        f"- Run: {report.started}, {'the quick subset' if report.quick else 'every fault'}, "
        f"{report.wall_seconds:g}s in all. The e2e test (tests/test_rl_drill.py) runs the quick subset "
        f"({', '.join(QUICK)}); `make rl-drill` runs every fault.",
        "",
        "## Healthy run",
        "",
        f"{report.healthy_seconds:g}s of training: " + healthy_verdict(report.healthy_alerts),
        "",
        f"RL board: {report.panels - len(report.empty_panels)} of {report.panels} queries returned data"
        + ("." if not report.empty_panels else "; empty: " + "; ".join(report.empty_panels)),
        "",
        "Series of the job in Prometheus: " + ", ".join(f"`{name}` {count}" for name, count in
                                                         sorted(report.series.items())) + ".",
        "",
    ]
    lines += outcome_lines(report.outcomes, report.false_alarms, report.ok,
                           "a reward that falls when episodes are cut off at 8 steps")
    return "\n".join(lines)
