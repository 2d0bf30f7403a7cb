"""The healing soak's arithmetic (`make heal-soak` runs the soak itself, 30 minutes on a real cluster):
the effective training time ratio over a run record built here, which steps and seconds a recovery
lost, how faults are drawn, and the soak's section of docs/healing-drill.md living beside the drill's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.recording import Recording, Series
from launcher.state import AttemptRecord, EventRecord, RunRecord
from scripts.heal_drill import ettr
from scripts.heal_drill.report import replace_section, section_of
from scripts.heal_drill.soak import KINDS, plan

PACE = 0.5  # seconds a step


def _steps(first: int, last: int, at: float) -> list[tuple[int, float]]:
    """An attempt that makes steps first..last, one every PACE seconds, the first at `at`."""
    return [(step, at + (step - first) * PACE) for step in range(first, last + 1)]


def _hung_then_healed() -> tuple[RunRecord, dict[int, ettr.Timeline]]:
    """Attempt 1 steps 1-100 from t=1000 (a checkpoint at step 60), hangs after step 100, is stopped;
    attempt 2 resumes from step 60 and steps 61-200 from t=1130; the soak stops the run at t=1200."""
    record = RunRecord(run_id="soak", name="soak", backend="local", attempts=[
        AttemptRecord(attempt=1, submission_id="soak-a1", first_step=1, first_step_at=1000.0, last_step=100,
                      last_progress_at=1049.5, ended_at=1112.0),
        AttemptRecord(attempt=2, submission_id="soak-a2", resumed_from_step=60, first_step=61, first_step_at=1130.0,
                      last_step=200, last_progress_at=1199.5)])
    record.events = [
        EventRecord(time=1110.0, kind="health.fault", attempt=1, details={"fault": "hang", "action": "restart",
                                                                            "summary": "hang (ranks 0-1 ...)"}),
        EventRecord(time=1112.0, kind="attempt.finished", attempt=1),
        EventRecord(time=1112.5, kind="retry.scheduled", attempt=1, details={"delay": 10}),
        EventRecord(time=1122.5, kind="attempt.submitting", attempt=2),
        EventRecord(time=1200.0, kind="attempt.stopping", attempt=2, details={"reason": "STOPPED"}),
    ]
    lines = {1: ettr.Timeline.of([(1, 1000.0), (60, 1029.5), (100, 1049.5)]),
             2: ettr.Timeline.of([(61, 1130.0), (200, 1199.5)])}
    return record, lines


def test_kept_progress_is_each_attempts_steps_up_to_where_the_next_resumed():
    record, lines = _hung_then_healed()
    accounting = ettr.account(record, lines, ettr.window_end(record))
    assert (accounting.start, accounting.end) == (1000.0, 1200.0)  # from the first step to the stop
    # attempt 1 keeps steps 1-60 (29.5 s after its first step); attempt 2 keeps 61-200, its first step's own
    # 0.5 s included
    assert [(k.attempt, k.first_step, k.last_step, k.seconds) for k in accounting.kept] == \
        [(1, 1, 60, 29.5), (2, 61, 200, 70.0)]
    assert accounting.ettr == pytest.approx(99.5 / 200)


def test_a_recovery_loses_the_redone_steps_and_the_time_without_progress():
    record, lines = _hung_then_healed()
    accounting = ettr.account(record, lines, ettr.window_end(record))
    (recovery,) = accounting.recoveries
    assert (recovery.fault, recovery.detected_at, recovery.next_first_step_at) == ("hang", 1110.0, 1130.0)
    assert (recovery.last_step, recovery.resumed_from, recovery.steps_lost) == (100, 60, 40)
    assert recovery.redone_seconds == pytest.approx(20.0)  # steps 61-100
    assert recovery.down_seconds == pytest.approx(80.0)  # 1049.5 to 1129.5: the hang, the stop, the backoff, the start
    assert recovery.backoff_seconds == 10
    # nothing is counted twice or left out
    total = accounting.kept_seconds + recovery.seconds_lost + accounting.tail_seconds
    assert total == pytest.approx(accounting.wall_seconds)


def test_steps_made_after_the_window_are_not_counted():
    record, lines = _hung_then_healed()
    accounting = ettr.account(record, lines, end=1150.0)
    assert accounting.kept[-1].last_step == 101  # (1150 - 1130) / 0.5 + 61
    assert accounting.kept[-1].end == pytest.approx(1150.0)


def test_a_resume_point_without_a_checkpoint_is_the_step_before_the_first():
    record, lines = _hung_then_healed()
    record.attempts[1].resumed_from_step = None
    assert ettr.resume_point(record, record.attempts[1], lines[2]) == 60
    record.events.append(EventRecord(time=1122.6, kind="run.resume", attempt=2, details={"step": 40}))
    assert ettr.resume_point(record, record.attempts[1], lines[2]) == 40


def test_step_times_come_from_the_recording_paired_by_rank_and_round():
    record, _ = _hung_then_healed()
    labels = {"submission_id": "soak-a1", "rank": "0", "node": "workers-1"}
    recorded = Recording(Path("metrics.jsonl.gz"), series={
        0: Series(0, "raypulse_train_step", "raypulse_train_step", labels, [1015.0, 1030.0, 1045.0], [29, 59, 50]),
        1: Series(1, "raypulse_train_last_progress_time_seconds", "raypulse_train_last_progress_time_seconds",
                  labels, [1015.0, 1030.0, 1045.0], [1014.0, 1029.0, 1044.5]),
    })
    lines = ettr.timelines(record, recorded)
    # the run record's first and last step, the recording's in between; step 50 reported after step 59 (a
    # late report) cannot be placed on the time line and is left out
    assert lines[1].points == [(1, 1000.0), (29, 1014.0), (59, 1029.0), (100, 1049.5)]
    assert lines[1].time_of(44) == pytest.approx(1021.5)


def test_an_attempt_without_steps_is_no_progress():
    record, _ = _hung_then_healed()
    with pytest.raises(ValueError, match="no attempt reported a step"):
        ettr.account(record, {}, 1200.0)


def test_faults_are_drawn_from_the_seed_and_every_four_have_every_kind():
    assert plan(30, 600, seed=0) == plan(30, 600, seed=0)
    assert [p.kind for p in plan(30, 600, seed=0)] != [p.kind for p in plan(30, 600, seed=1)] or \
        [p.offset for p in plan(30, 600, seed=0)] != [p.offset for p in plan(30, 600, seed=1)]
    faults = plan(80, 600, seed=7)
    assert len(faults) == 8
    assert set(p.kind for p in faults[:4]) == set(KINDS) == set(p.kind for p in faults[4:])
    for index, fault in enumerate(faults):  # one per slot, in its first half
        assert index * 600 + 120 <= fault.offset <= index * 600 + 300
    nodes = [p.node for p in faults if p.kind in ("xid-79", "node-killed")]
    assert nodes == ["workers-1", "workers-2"] * 2  # node faults take the workers in turn


def test_the_soak_section_is_replaced_and_the_drill_keeps_it():
    drill = "# Healing drill\n\nthe drill's table\n"
    with_soak = replace_section(drill, "## Soak", "## Soak\n\nfirst soak\n")
    assert with_soak == "# Healing drill\n\nthe drill's table\n\n## Soak\n\nfirst soak\n"
    again = replace_section(with_soak + "\n## After\n\nkept\n", "## Soak", "## Soak\n\nsecond soak\n")
    assert again == "# Healing drill\n\nthe drill's table\n\n## Soak\n\nsecond soak\n\n## After\n\nkept\n"
    assert section_of(again, "## Soak") == "## Soak\n\nsecond soak\n"
    assert section_of(drill, "## Soak") is None
