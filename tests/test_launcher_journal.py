"""The run journal: one event becomes the record's change, its event list, the audit line and the display
line; a kind the record and the trace do not know is still listed and audited as declared."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from launcher import audit
from launcher.display import PlainReporter
from launcher.journal import KINDS, Journal
from launcher.state import RunRecord, load_run


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    return tmp_path


def journal(record: RunRecord | None = None) -> tuple[Journal, io.StringIO]:
    err = io.StringIO()
    return Journal(PlainReporter(err=err, out=io.StringIO()), record), err


def test_an_attempts_events_keep_the_record_the_audit_log_and_the_display_in_step(home: Path):
    record = RunRecord(run_id="r-1", name="r", backend="local", max_attempts=2)
    run, shown = journal(record)
    run.emit("attempt.submitting", attempt=1, submission_id="r-1-a1")
    run.emit("attempt.submitted", attempt=1, submission_id="r-1-a1", address="http://h:8265", entrypoint="python t.py")
    run.emit("attempt.running", attempt=1, submission_id="r-1-a1")
    run.emit("retry.scheduled", attempt=1, delay=2.0, cause="hang")
    saved = load_run("r-1")
    assert saved is not None
    assert saved.state == "RETRYING"
    assert (saved.attempts[0].submission_id, saved.attempts[0].running_at is not None) == ("r-1-a1", True)
    assert [event.kind for event in saved.events] == ["attempt.submitting", "attempt.submitted", "attempt.running",
                                                      "retry.scheduled"]
    assert "entrypoint" not in saved.events[1].details  # the command line stays in the audit log only
    assert shown.getvalue().splitlines() == ["launcher: attempt 1/2 submitted as r-1-a1",
                                             "launcher: attempt 1/2 RUNNING",
                                             "launcher: attempt 1 stopped (hang); attempt 2 in 2s"]
    [line] = audit.read()
    assert (line["action"], line["result"], line["run_id"], line["attempt"]) == ("attempt.submit", "ok", "r-1", 1)


def test_the_end_of_a_run_is_one_event(home: Path):
    record = RunRecord(run_id="r-2", name="r", backend="local")
    run, _ = journal(record)
    run.emit("run.finished", state="UNHEALTHY", reason="hang (...)", attempts=1, exit_code=7)
    saved = load_run("r-2")
    assert (saved.state, saved.exit_code, saved.reason) == ("UNHEALTHY", 7, "hang (...)")
    assert saved.finished_at is not None
    assert [(line["action"], line["result"]) for line in audit.read()] == [("run.finish", "UNHEALTHY")]


def test_a_fault_is_a_warning_an_audit_line_and_an_event_with_its_evidence(home: Path):
    record = RunRecord(run_id="r-3", name="r", backend="local", max_attempts=3)
    run, shown = journal(record)
    run.emit("health.fault", attempt=2, fault="hang", summary="hang (ranks 0-7 made no progress for 900 s; last "
             "step 41200)", action="restart", node=None, at=1.0, last_step=41200, evidence={"ranks": [0, 7]})
    assert shown.getvalue() == ("launcher: warning: attempt 2: hang (ranks 0-7 made no progress for 900 s; last step "
                                "41200); stopping the attempt; a new one resumes from the last checkpoint\n")
    [line] = audit.read()
    assert (line["action"], line["result"], line["fault"]) == ("health.fault", "restart", "hang")
    assert load_run("r-3").events[-1].details["evidence"] == {"ranks": [0, 7]}


def test_without_a_record_events_are_audited_and_shown_only(home: Path):
    run, shown = journal()
    run.emit("command.refused", command="submit", error="entrypoint: required")
    assert shown.getvalue() == ""
    [line] = audit.read()
    assert (line["action"], line["result"], line["error"]) == ("submit", "bad input", "entrypoint: required")
    assert not (home / "runs").exists()


def test_every_kind_that_speaks_says_something_for_its_own_details():
    """Each display line renders from the details its emitters give (a KeyError would surface in a run)."""
    samples = {"attempt": 2, "max_attempts": 3, "submission_id": "r-a2", "status": "FAILED", "message": "boom",
               "run_id": "r", "why": "stop requested", "delay": 1.0, "cause": "hang", "step": 40, "path": "/c/s.json",
               "node": "workers-1", "error": "refused", "summary": "hang (...)", "action": "restart",
               "directory": "/x", "fault": "hang", "first_step": 41, "recover_seconds": 3.0, "detect_seconds": 1.0,
               "steps_lost": 2, "seconds": 4.0, "reason": "GPU fault", "host_denied": "10.0.0.2",
               "cluster": "c", "address": "http://h", "killed": 0, "stopped": ["a"], "state": "SUCCEEDED",
               "result": "ok", "command": "submit", "failed": [], "dropped": 1, "example": "'m{a\\nb}'",
               "rule": "steps", "basis": "10 x p99 report interval 0.21 s (25 seen), floor 60 s", "phase": None,
               "source": "head"}
    for kind in KINDS.values():
        if kind.say is not None:
            assert isinstance(kind.say(samples), str), kind.name
        if callable(kind.audit):
            assert isinstance(kind.audit(samples), str), kind.name
        assert isinstance(kind.result(samples), str), kind.name
    json.dumps(samples)
