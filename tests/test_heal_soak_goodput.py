"""The healing soak's checks of the launcher's own accounts (scripts/heal_drill/goodput.py, issue 38) and its
section rendering two soaks side by side from their --json, over a run record built here (no Ray: the soak
itself is `make heal-soak`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher import checkpoint_advice
from launcher.ledger import ledger
from launcher.state import AttemptRecord, EventRecord, RunRecord
from scripts.heal_drill import ettr, goodput
from scripts.heal_drill.soak import Injected, Options, Soak, from_json, main, render, to_json


def _record() -> RunRecord:
    """One step a second. Attempt 1 steps 1-100 (1000-1099), hangs, is judged at 1165 (threshold 60 s) and ends
    at 1167; a 10 s backoff; attempt 2 resumes from step 90 and steps 91-200 (1185-1294); workers-1 is killed,
    attempt 2 ends at 1301, the node is replaced; attempt 3 resumes from 180 and steps 181-400 (1310-1529); the
    soak stops the run at 1535 and it ends at 1540. Saves take 0.01 s, every 30 s."""
    record = RunRecord(run_id="soak-x", name="heal-soak", backend="local", created_at=900.0, attempts=[
        AttemptRecord(attempt=1, submission_id="a1", status="STOPPED", submitted_at=990.0, running_at=992.0,
                      ended_at=1167.0, first_step=1, first_step_at=1000.0, last_step=100, last_progress_at=1099.0),
        AttemptRecord(attempt=2, submission_id="a2", status="STOPPED", submitted_at=1177.5, running_at=1179.0,
                      ended_at=1301.0, resumed_from_step=90, first_step=91, first_step_at=1185.0, last_step=200,
                      last_progress_at=1294.0),
        AttemptRecord(attempt=3, submission_id="a3", status="STOPPED", submitted_at=1305.0, running_at=1306.0,
                      ended_at=1538.0, resumed_from_step=180, first_step=181, first_step_at=1310.0, last_step=400,
                      last_progress_at=1529.0, checkpoint_seconds=0.01, first_checkpoint=(1.0, 1334.0),
                      last_checkpoint=(7.0, 1514.0))],
        spec={"entrypoint": "python train.py --workers 2 --step-seconds 1 --checkpoint-every 30"})
    hang = {"quiet_seconds": 66.0, "ranks": [0, 1], "threshold": 60.0, "threshold_rule": "steps",
            "threshold_basis": "10 x p99 report interval 1.0 s (300 seen), floor 60 s"}
    record.events = [
        EventRecord(time=1165.0, kind="health.fault", attempt=1,
                    details={"fault": "hang", "action": "restart", "summary": "hang", "at": 1099.0, "evidence": hang}),
        EventRecord(time=1167.0, kind="attempt.finished", attempt=1),
        EventRecord(time=1167.5, kind="retry.scheduled", attempt=1, details={"delay": 10}),
        EventRecord(time=1177.5, kind="attempt.submitting", attempt=2),
        EventRecord(time=1185.0, kind="health.recovered", attempt=2, details={"steps_lost": 10}),
        EventRecord(time=1300.0, kind="health.fault", attempt=2,
                    details={"fault": "node_lost", "action": "restart", "summary": "node lost", "at": 1299.5}),
        EventRecord(time=1301.0, kind="attempt.finished", attempt=2),
        EventRecord(time=1304.0, kind="node.replaced", details={"node": "workers-1", "seconds": 3.0}),
        EventRecord(time=1305.0, kind="attempt.submitting", attempt=3),
        EventRecord(time=1310.0, kind="health.recovered", attempt=3, details={"steps_lost": 20}),
        EventRecord(time=1535.0, kind="attempt.stopping", attempt=3, details={"reason": "STOPPED"}),
    ]
    record.state, record.finished_at = "STOPPED", 1540.0
    split = ledger(record)  # what launcher/run.py's finish_run keeps with the run's end
    record.events.append(EventRecord(time=1540.0, kind="run.finished", details={
        "state": "STOPPED", "seconds_by_cause": {cause: round(value, 3) for cause, value in split.seconds.items()
                                                 if value}}))
    return record


INJECTED = [Injected(1, "hang", None, planned_at=1098.0, at=1098.5, attempt=1),
            Injected(2, "node-killed", "workers-1", planned_at=1299.0, at=1299.2, attempt=2)]


def _checks(record: RunRecord) -> goodput.Checks:
    lines = ettr.timelines(record, None)
    accounting = ettr.account(record, lines, ettr.window_end(record))
    return goodput.checks(record, accounting, [(entry.index, entry.kind, entry.attempt, entry.at)
                                               for entry in INJECTED])


def test_the_ledgers_causes_add_up_to_the_wall_time_and_one_off_by_more_than_one_percent_is_a_miss():
    record = _record()
    check = _checks(record)
    assert check.ledger is not None
    assert check.ledger.wall == 640.0  # created 900, finished 1540
    assert check.ledger.total == pytest.approx(640.0, abs=0.01)
    assert check.ledger.ok
    assert check.failed() == []
    record.events[-1].details["seconds_by_cause"]["productive"] += 7.0  # 1.1% over
    check = _checks(record)
    assert not check.ledger.ok
    assert any("the ledger's causes sum to 647.0 s against 640.0 s" in line for line in check.failed())


def test_a_run_that_ended_without_the_ledgers_split_is_a_miss():
    record = _record()
    record.events.pop()
    check = _checks(record)
    assert check.ledger is None
    assert check.redone_ledger_s is None
    assert any("without the ledger's split" in line for line in check.failed())


def test_the_launchers_part_of_a_fault_is_its_time_without_progress_less_the_backoff():
    hang, node = _checks(_record()).faults
    # hang: the ranks stopped at 1098.5, after step 100 (1099: its report came later); attempt 2's first step's
    # work began at 1184, 85 s later, 10 of them the backoff
    assert (hang.kind, hang.launcher_s, hang.bound_s, hang.part_ok) == ("hang", pytest.approx(75.0), 80.0, True)
    assert (hang.threshold_s, hang.threshold_rule, hang.quiet_s) == (60.0, "steps", 66.0)
    assert hang.judged_after_last_step_s == pytest.approx(66.0)
    assert hang.hang_ok
    # node: killed at 1299.2, after its last step (1294); attempt 3's first step's work began at 1309, no backoff
    assert (node.launcher_s, node.bound_s, node.part_ok) == (pytest.approx(9.8), 20.0, True)
    assert node.threshold_s is None
    assert node.judged_after_last_step_s is None
    assert node.hang_ok is None


def test_a_launchers_part_over_its_bound_and_a_late_hang_are_misses():
    record = _record()
    record.events[0].time = 1230.0  # judged 131 s after the last step
    hang = _checks(record).faults[0]
    assert hang.hang_ok is False
    assert any("judged 131.0 s after the last step" in line for line in _checks(record).failed())
    record.events[0].details["evidence"]["threshold"] = 20.0  # 75 s > 20 + 20
    assert _checks(record).faults[0].part_ok is False
    assert any("the launcher's part 75.0 s > 40.0 s" in line for line in _checks(record).failed())


def test_the_steps_the_launcher_said_lost_agree_with_the_soaks_count_within_one():
    record = _record()
    check = _checks(record)
    assert [(fault.steps_launcher, fault.steps_soak, fault.steps_agree) for fault in check.faults] == \
        [(10, 10, True), (20, 20, True)]
    record.events[4].details["steps_lost"] = 12
    assert _checks(record).faults[0].steps_agree is False


def test_the_ledgers_redone_seconds_agree_with_the_soaks_within_a_step_per_fault():
    check = _checks(_record())
    # the ledger counts a resumed attempt's first step in its startup: one step fewer per fault than the soak
    assert (check.redone_ledger_s, check.redone_soak_s, check.redone_tolerance_s) == \
        (pytest.approx(28.0), pytest.approx(30.0), pytest.approx(2.0))
    assert check.redone_ok


def test_the_advice_is_the_launchers_from_the_measured_cost_and_the_runs_own_faults():
    advice = _checks(_record()).advice
    assert advice is not None
    assert advice.why is None
    assert (advice.cost_s, advice.interval_s, advice.faults) == (0.01, 30.0, 2)
    assert advice.advised_s == pytest.approx(checkpoint_advice.young_daly_s(0.01, advice.mtbf_s))
    assert advice.advised_s < 30.0


def _soak(tmp_path: Path, name: str, checkpoint_seconds: float, advised_from: str | None = None) -> Path:
    """A finished soak's --json and the run directory it names."""
    run_dir = tmp_path / name / "home" / "runs" / "soak-x"
    run_dir.mkdir(parents=True)
    record = _record()
    (run_dir / "run.json").write_text(record.model_dump_json())
    _, accounting = ettr.of_run(run_dir)
    options = Options(minutes=9, fault_every=300, step_seconds=1.0, checkpoint_seconds=checkpoint_seconds,
                      advised_from=advised_from, workdir=tmp_path / name)
    result = Soak(options, f"python -m scripts.heal_drill.soak --checkpoint-seconds {checkpoint_seconds:g}",
                  "2026-12-05 19:00 UTC", run_dir, INJECTED, record, accounting, [0.5, 1.5])
    path = tmp_path / f"{name}.json"
    path.write_text(to_json(result))
    return path


def test_two_soaks_render_side_by_side_from_their_json(tmp_path):
    first = _soak(tmp_path, "every-30", 30.0)
    assert json.loads(first.read_text())["advice"]["advised_s"] < 30.0
    second = _soak(tmp_path, "advised", 2.0, advised_from=str(first))
    section = render([from_json(first), from_json(second)])
    assert "| | checkpoints every 30 s | checkpoints at the advised interval (2 s: every 2 steps) |" in section
    assert "### Checkpoints every 30 s" in section
    assert "### Checkpoints at the advised interval (2 s: every 2 steps)" in section
    ettr_row = next(line for line in section.splitlines() if line.startswith("| **ETTR**"))
    assert ettr_row.count("%") == 2
    assert section.count("Checks: **all met**.") == 2
    assert "judged 66 s after the last step (≤ 120 s: yes)" in section
    # the same record twice: the same loss, so not less
    assert "65.0 s lost per recovery against 65.0 s" in section
    assert "**it did not lose less**." in section


def test_render_from_json_writes_the_section_into_the_doc(tmp_path, capsys):
    first, second = _soak(tmp_path, "every-30", 30.0), _soak(tmp_path, "advised", 2.0)
    doc = tmp_path / "healing-drill.md"
    doc.write_text("# Healing drill\n\nthe drill\n\n## Soak\n\nold\n")
    assert main(["--from-json", str(first), str(second), "--output", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Healing drill\n\nthe drill\n\n## Soak\n")
    assert "\n\nold\n" not in text
    assert "checkpoints every 2 s" in text  # without advised_from: an interval given


def test_advised_from_needs_a_soak_that_ended_with_advice(tmp_path, capsys):
    path = tmp_path / "soak.json"
    path.write_text(json.dumps({"advice": {"advised_s": None, "why": "too little data"}}))
    with pytest.raises(SystemExit) as exited:
        main(["--advised-from", str(path)])
    assert exited.value.code == 2
    assert "--advised-from" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--advised-from", str(tmp_path / "missing.json")])
    assert "missing.json" in capsys.readouterr().err
