"""The healing drill's Markdown report (docs/healing-drill.md)."""

from __future__ import annotations

from scripts.heal_drill.run import (
    CHECK_S,
    HANG_AFTER_S,
    INJECT_AT_STEP,
    RECOVERY_SLACK_S,
    SILENCE_AFTER_S,
    STEP_S,
    STEPS,
    Outcome,
    Report,
)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:g}s"


def _row(outcome: Outcome) -> str:
    verdict = "yes" if outcome.ok else "**no**"
    recovered = _seconds(outcome.recovered)
    if outcome.fault and outcome.recovered is not None:
        recovered += f" (≤ {outcome.threshold + RECOVERY_SLACK_S:g}s)"
    effective = "—" if outcome.effective is None else f"{outcome.effective:.0%}"
    detail = "; ".join(part for part in (outcome.named, outcome.node_action, outcome.stacks, outcome.error) if part)
    return (f"| {outcome.scenario} | {outcome.injected} | {_seconds(outcome.detected)} | {recovered} | "
            f"{'—' if outcome.steps_lost is None else outcome.steps_lost} | {outcome.restarts} | "
            f"{outcome.state} ({outcome.exit_code}) | {effective} | {verdict} | {detail or '—'} |")


def render(report: Report) -> str:
    lines = [
        "# Healing drill",
        "",
        "<!-- Written by `make heal-drill` (python -m scripts.heal_drill --output docs/healing-drill.md); "
        "do not edit. -->",
        "",
        f"Run {report.started}, {report.wall_seconds:g}s in all{' (the quick subset)' if report.quick else ''}. "
        "Each scenario is a run of its own on a real local Ray cluster started by `launcher submit` (a head and "
        "two workers with one simulated GPU each, one exporter per node), running the drill's job "
        f"(`scripts/heal_drill/job.py`: two ranks that step together, {STEPS} steps of {STEP_S:g}s, a checkpoint "
        "every 10 steps, resuming from RAYPULSE_RESUME_FROM). The fault is injected at step "
        f"{INJECT_AT_STEP}. The health policy is the product's, with its thresholds scaled down: a hang after "
        f"{HANG_AFTER_S:g}s without progress (the default is 900s, as the alert rule), silence after "
        f"{SILENCE_AFTER_S:g}s (default 1800s), a check every {CHECK_S:g}s (default 10s); max_retries 2, a 1s "
        "backoff.",
        "",
        "Detected: from the injection to the watcher's `health.fault` event. Recovered: from the injection to "
        "the first step of the attempt that replaced the faulty one, when the job made it (as it reported it; "
        "for a job that reports no steps: to the attempt's start), which must stay within the detection "
        f"threshold + {RECOVERY_SLACK_S:g}s. Steps lost: the last step before the fault less the checkpoint step "
        "the new attempt resumed from (at most one checkpoint interval, 10). The healthy run must not restart "
        "at all.",
        "",
        "| scenario | fault injected | detected | recovered | steps lost | restarts | final state | effective "
        "training | ok | what the launcher said and did |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(outcome) for outcome in report.outcomes]
    lines += ["", f"Result: **{'PASSED' if report.ok else 'FAILED'}**", ""]
    return "\n".join(lines)


def _bounds(lines: list[str], heading: str) -> tuple[int, int] | None:
    """Where `heading`'s section is in `lines`: its heading line to the next heading of its level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    start = next((index for index, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        return None
    end = next((index for index in range(start + 1, len(lines))
                if lines[index].startswith("#") and len(lines[index]) - len(lines[index].lstrip("#")) <= level),
               len(lines))
    return start, end


def section_of(text: str, heading: str) -> str | None:
    """The section of Markdown `text` under `heading` (e.g. "## Soak"), heading included; None if absent."""
    lines = text.splitlines()
    bounds = _bounds(lines, heading)
    return None if bounds is None else "\n".join(lines[bounds[0]:bounds[1]]).rstrip("\n") + "\n"


def replace_section(text: str, heading: str, section: str) -> str:
    """Markdown `text` with its `heading` section replaced by `section` (appended if it has none); the
    rest of the file as it was. The drill and the soak share docs/healing-drill.md this way."""
    lines = text.splitlines()
    bounds = _bounds(lines, heading)
    new = section.rstrip("\n").splitlines()
    if bounds is None:
        kept = "\n".join(lines).rstrip("\n")
        return (kept + "\n\n" if kept else "") + "\n".join(new) + "\n"
    before, after = lines[:bounds[0]], lines[bounds[1]:]
    return "\n".join([*before, *new, *(["", *after] if after else [])]).rstrip("\n") + "\n"
