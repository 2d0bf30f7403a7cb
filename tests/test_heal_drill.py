"""The healing drill, end to end, on its quick subset (`make heal-drill` runs every fault): real local
clusters started by the launcher, the drill's training job, a healthy run that must not restart, and
two faults that must heal from the last checkpoint, one of them by replacing a node. The report's
verdicts are unit-tested here too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.heal_drill.report import render
from scripts.heal_drill.run import RECOVERY_SLACK_S, SCENARIOS, Outcome, Report
from tests.conftest import REPO


def test_the_quick_subset_covers_a_hang_a_node_replacement_and_a_healthy_run():
    quick = {scenario.name: scenario for scenario in SCENARIOS if scenario.quick}
    assert set(quick) == {"healthy", "all-ranks-hung", "xid-79"}
    assert {scenario.fault for scenario in SCENARIOS} == {"", "hang", "gpu_fault", "node_lost", "nonfinite_loss"}


def test_the_report_holds_each_recovery_to_its_budget():
    healed = Outcome("xid-79", "gpu_fault", "XID 79", threshold=1.0, exit_code=0, state="SUCCEEDED", detected=1.5,
                     recovered=14.4, steps_lost=6, restarts=1, attempts=2)
    late = Outcome("hang", "hang", "SIGSTOP", threshold=8.0, exit_code=0, detected=8.5,
                   recovered=8.0 + RECOVERY_SLACK_S + 1, steps_lost=2)
    restarted = Outcome("healthy", "", "nothing", threshold=0.0, exit_code=0, restarts=1)
    assert healed.ok
    assert not late.ok
    assert not restarted.ok  # a healthy run that restarts is a false alarm
    text = render(Report(quick=True, outcomes=[healed, late, restarted]))
    assert "| xid-79 | XID 79 | 1.5s | 14.4s (≤ 61s) | 6 | 1 | SUCCEEDED (0) |" in text
    assert text.count("**no**") == 2
    assert "Result: **FAILED**" in text


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_quick_drill_heals_each_fault_within_budget_and_leaves_a_healthy_run_alone(tmp_path: Path):
    results = tmp_path / "heal.json"
    run = subprocess.run([sys.executable, "-m", "scripts.heal_drill", "--quick", "--json", str(results)], cwd=REPO,
                         capture_output=True, text=True, timeout=840)
    assert results.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(results.read_text())
    outcomes = {outcome["scenario"]: outcome for outcome in report["outcomes"]}
    assert set(outcomes) == {"healthy", "all-ranks-hung", "xid-79"}
    assert [name for name, outcome in outcomes.items() if not outcome["ok"]] == [], run.stdout[-4000:]
    assert run.returncode == 0, run.stderr[-3000:]
    healthy, hang, xid = outcomes["healthy"], outcomes["all-ranks-hung"], outcomes["xid-79"]
    assert (healthy["restarts"], healthy["attempts"], healthy["state"]) == (0, 1, "SUCCEEDED")
    assert hang["named"].startswith("hang (ranks 0-1 made no progress for")
    assert hang["stacks"].startswith("3 stack(s): ")  # both ranks and the driver, each where it stopped
    assert xid["named"] == "GPU fault (XID 79 on GPU 0 on workers-1)"
    assert xid["node_action"].startswith("workers-1 replaced by a fresh node in")
    for outcome in (hang, xid):
        assert outcome["attempts"] == 2
        assert outcome["steps_lost"] <= 10
