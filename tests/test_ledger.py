"""The goodput ledger (launcher/ledger.py): hand-made runs built from the journal's own event kinds
and the progress facts the healer keeps; every second is one cause and the causes add up to the
wall time."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.cli import _status_text
from launcher.display import PlainReporter
from launcher.journal import KINDS, Journal
from launcher.ledger import CAUSES, ledger
from launcher.run import finish_run
from launcher.state import AttemptRecord, EventRecord, RunRecord, load_run

T0 = 1_000_000.0


def event(offset: float, kind: str, attempt: int | None = None, **details: Any) -> EventRecord:
    assert kind in KINDS, f"{kind} is not an event kind the journal emits"
    return EventRecord(time=T0 + offset, kind=kind, attempt=attempt, details=details)


def attempt(number: int, submitted: float, *, running: float, first: tuple[int, float] | None = None,
            newest: tuple[int, float] | None = None, resumed_from: int | None = None,
            status: str = "SUCCEEDED") -> AttemptRecord:
    return AttemptRecord(attempt=number, submission_id=f"r-a{number}", status=status, submitted_at=T0 + submitted,
                         running_at=T0 + running, resumed_from_step=resumed_from,
                         first_step=first[0] if first else None, first_step_at=T0 + first[1] if first else None,
                         last_step=newest[0] if newest else None, last_progress_at=T0 + newest[1] if newest else None)


def run(state: str, finished: float, attempts: list[AttemptRecord], events: list[EventRecord]) -> RunRecord:
    return RunRecord(run_id="r", name="r", backend="local", state=state, created_at=T0, finished_at=T0 + finished,
                     attempts=attempts, events=events)


def split(record: RunRecord) -> dict[str, float]:
    result = ledger(record)
    assert set(result.seconds) == set(CAUSES)
    assert sum(result.seconds.values()) == pytest.approx(result.wall)
    assert result.wall == pytest.approx(record.finished_at - record.created_at)
    return {cause: round(seconds, 6) for cause, seconds in result.seconds.items() if seconds}


def test_a_clean_run_is_cluster_start_startup_training_and_its_end():
    # cluster up in 20 s, submitted at 20, RUNNING at 25, step 1 at 40, step 100 at 139 (1 s a step),
    # the job ends at 142, the run at 145 (teardown).
    record = run("SUCCEEDED", 145, [attempt(1, 20, running=25, first=(1, 40), newest=(100, 139))], [
        event(0, "cluster.starting", cluster="c", nodes=2),
        event(20, "cluster.up", address="127.0.0.1:6379"),
        event(20, "attempt.submitted", 1, submission_id="r-a1"),
        event(25, "attempt.running", 1, submission_id="r-a1"),
        event(142, "attempt.finished", 1, submission_id="r-a1", status="SUCCEEDED", state="SUCCEEDED"),
        event(145, "run.finished", state="SUCCEEDED"),
    ])
    assert split(record) == {"provisioning": 20, "startup": 20, "productive": 99, "stopping": 6}
    assert ledger(record).ettr == pytest.approx(99 / 145, abs=1e-4)


def test_the_ranks_saves_are_checkpoint_stall_taken_from_the_productive_time():
    # The clean run above, whose ranks saved 4 times at 2.5 s each (the newest save's cost, the slowest rank's).
    trained = attempt(1, 20, running=25, first=(1, 40), newest=(100, 139))
    saved = trained.model_copy(update={"checkpoint_seconds": 2.5, "first_checkpoint": (1.0, T0 + 60),
                                       "last_checkpoint": (4.0, T0 + 120)})
    events = [event(20, "attempt.submitted", 1, submission_id="r-a1"),
              event(142, "attempt.finished", 1, submission_id="r-a1", status="SUCCEEDED", state="SUCCEEDED")]
    assert split(run("SUCCEEDED", 145, [saved], events)) == {
        "provisioning": 20, "startup": 20, "productive": 89, "checkpoint_stall": 10, "stopping": 6}


def test_a_hang_restarted_from_a_checkpoint_redoes_the_steps_made_since_it():
    # Attempt 1: steps 1..35 from 10 to 44; hangs (no step after 44); judged at 104; stopped by 110.
    # Backoff 5 s from 111; node work till 120 is provisioning; attempt 2 submitted at 120, resumes from
    # step 30, step 31 at 130 and step 80 at 179: steps 31..35 are redone (31 at 130 .. 35 at 134).
    first = attempt(1, 0, running=2, first=(1, 10), newest=(35, 44), status="STOPPED")
    second = attempt(2, 120, running=122, first=(31, 130), newest=(80, 179), resumed_from=30)
    record = run("SUCCEEDED", 181, [first, second], [
        event(0, "attempt.submitted", 1, submission_id="r-a1"),
        event(2, "attempt.running", 1, submission_id="r-a1"),
        event(104, "health.fault", 1, fault="hang", summary="no step for 60s", action="restart", at=T0 + 44,
              last_step=35),
        event(104.5, "attempt.stopping", 1, submission_id="r-a1", reason="UNHEALTHY", why="hang"),
        event(110, "attempt.finished", 1, submission_id="r-a1", status="STOPPED", state="UNHEALTHY"),
        event(111, "retry.scheduled", 1, delay=5, cause="hang"),
        event(119, "run.resume", 2, step=30),
        event(120, "attempt.submitted", 2, submission_id="r-a2"),
        event(122, "attempt.running", 2, submission_id="r-a2"),
        event(180, "attempt.finished", 2, submission_id="r-a2", status="SUCCEEDED", state="SUCCEEDED"),
        event(181, "run.finished", state="SUCCEEDED"),
    ])
    assert split(record) == {"startup": 10 + 10, "productive": 34 + 45, "detecting": 60, "stopping": 6 + 2,
                             "backoff": 5, "provisioning": 1 + 4, "redone": 4}


def test_a_run_that_fails_for_good_loses_what_followed_its_last_step():
    # One attempt: steps 1..50 from 10 to 59, then it fails by itself at 70; no retry; the run ends at 72.
    record = run("FAILED", 72, [attempt(1, 0, running=3, first=(1, 10), newest=(50, 59), status="FAILED")], [
        event(0, "attempt.submitted", 1, submission_id="r-a1"),
        event(3, "attempt.running", 1, submission_id="r-a1"),
        event(70, "attempt.finished", 1, submission_id="r-a1", status="FAILED", state="FAILED",
              message="driver exited 1"),
        event(72, "run.finished", state="FAILED", reason="driver exited 1"),
    ])
    assert split(record) == {"startup": 10, "productive": 49, "lost_to_end": 13}


def test_a_run_still_going_is_counted_up_to_now():
    record = run("RUNNING", 0, [attempt(1, 0, running=1, first=(1, 5), newest=(20, 24), status="RUNNING")], [
        event(0, "attempt.submitted", 1, submission_id="r-a1"),
        event(1, "attempt.running", 1, submission_id="r-a1"),
    ])
    record.finished_at = None
    result = ledger(record, now=T0 + 30)
    assert result.wall == 30
    assert {cause: seconds for cause, seconds in result.seconds.items() if seconds} == {
        "startup": 5, "productive": 25}


def test_a_node_lost_under_a_failed_attempt_is_detected_after_it_ended_and_nothing_is_redone():
    # Attempt 1 makes steps 1..40 (5 to 44) and fails at 50; its node is found dead at 52 (it died at 46);
    # the node is replaced till 60; 1 s of backoff; attempt 2 resumes from 40: step 41 at 70, 90 at 119.
    first = attempt(1, 0, running=1, first=(1, 5), newest=(40, 44), status="FAILED")
    second = attempt(2, 61, running=62, first=(41, 70), newest=(90, 119), resumed_from=40)
    record = run("SUCCEEDED", 121, [first, second], [
        event(0, "attempt.submitted", 1, submission_id="r-a1"),
        event(50, "attempt.finished", 1, submission_id="r-a1", status="FAILED", state="FAILED"),
        event(52, "health.fault", 1, fault="node_lost", summary="node w-1 died", action="restart", node="w-1",
              at=T0 + 46, last_step=40),
        event(60, "node.replaced", node="w-1", seconds=8, reason="node w-1 died"),
        event(60, "retry.scheduled", 1, delay=1, cause="node_lost"),
        event(61, "attempt.submitted", 2, submission_id="r-a2"),
        event(120, "attempt.finished", 2, submission_id="r-a2", status="SUCCEEDED", state="SUCCEEDED"),
        event(121, "run.finished", state="SUCCEEDED"),
    ])
    assert split(record) == {"startup": 5 + 9, "productive": 39 + 49, "detecting": 8, "provisioning": 8,
                             "backoff": 1, "stopping": 2}


def test_a_stopped_run_keeps_its_steps_and_its_stop_is_stopping():
    record = run("STOPPED", 30, [attempt(1, 0, running=1, first=(1, 5), newest=(20, 24), status="STOPPED")], [
        event(0, "attempt.submitted", 1, submission_id="r-a1"),
        event(24.5, "attempt.stopping", 1, submission_id="r-a1", reason="STOPPED", why="stop requested"),
        event(28, "attempt.finished", 1, submission_id="r-a1", status="STOPPED", state="STOPPED"),
        event(30, "run.finished", state="STOPPED"),
    ])
    assert split(record) == {"startup": 5, "productive": 19, "stopping": 6}


def test_a_run_waiting_out_its_backoff_is_in_backoff_now():
    record = run("RETRYING", 0, [attempt(1, 0, running=1, first=(1, 5), newest=(20, 25), status="FAILED")], [
        event(0, "attempt.submitted", 1, submission_id="r-a1"),
        event(30, "attempt.finished", 1, submission_id="r-a1", status="FAILED", state="FAILED"),
        event(31, "retry.scheduled", 1, delay=10, cause="failed"),
    ])
    record.finished_at = None
    result = ledger(record, now=T0 + 36)
    assert {cause: seconds for cause, seconds in result.seconds.items() if seconds} == {
        "startup": 5, "productive": 20, "detecting": 5, "provisioning": 1, "backoff": 5}


def test_the_waits_in_the_queue_are_queued_before_and_after_a_preemption():
    # Kueue holds the RayJob 0-30 s; KubeRay starts its cluster (provisioning) and runs attempt 1 from 40 until
    # Kueue preempts it at 70; queued again 70-100; attempt 2 from 110 to its end at 150, the run's at 152.
    record = run("SUCCEEDED", 152, [attempt(1, 40, running=40, first=(1, 45), newest=(20, 69), status="STOPPED"),
                                    attempt(2, 110, running=110, first=(21, 115), newest=(60, 149))], [
        event(1, "run.queued", queue="team-nlp"),
        event(30, "run.admitted", seconds=29),
        event(40, "attempt.submitted", 1, submission_id="r-a1"),
        event(70, "run.queued", queue="team-nlp"),
        event(70, "attempt.finished", 1, submission_id="r-a1", status="STOPPED", state="STOPPED"),
        event(70, "attempt.preempted", 1),
        event(100, "run.admitted", seconds=30),
        event(110, "attempt.submitted", 2, submission_id="r-a2"),
        event(150, "attempt.finished", 2, submission_id="r-a2", status="SUCCEEDED", state="SUCCEEDED"),
        event(152, "run.finished", state="SUCCEEDED"),
    ])
    assert split(record) == {"queued": 59, "provisioning": 1 + 10 + 10, "startup": 5 + 5, "productive": 24 + 34,
                             "detecting": 1, "stopping": 1 + 2}


def test_a_run_still_in_the_queue_is_queued_until_now():
    record = run("PENDING", 0, [], [event(2, "run.queued", queue="team-nlp")])
    record.finished_at = None
    result = ledger(record, now=T0 + 12)
    assert {cause: seconds for cause, seconds in result.seconds.items() if seconds} == {
        "provisioning": 2, "queued": 10}
    assert "queued 10s" in result.line()


def test_launcher_status_shows_where_the_time_went(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))  # its checkpoint advice pools the runs there: none
    record = run("FAILED", 72, [attempt(1, 0, running=3, first=(1, 10), newest=(50, 59), status="FAILED")], [
        event(0, "attempt.submitted", 1, submission_id="r-a1"),
        event(70, "attempt.finished", 1, submission_id="r-a1", status="FAILED", state="FAILED"),
        event(72, "run.finished", state="FAILED"),
    ])
    [line] = [line for line in _status_text(record).splitlines() if line.startswith("time")]
    assert line == "time      72s: productive 49s (68.1%), startup 10s, lost to end 13s"


def test_the_split_is_kept_with_the_runs_end(tmp_path: Path, monkeypatch):
    # The cluster was lost under attempt 1 (no attempt.finished): after its newest step, lost to the end.
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    start = time.time() - 100
    record = RunRecord(run_id="r-k", name="r", backend="local", created_at=start, attempts=[AttemptRecord(
        attempt=1, submission_id="r-k-a1", status="RUNNING", submitted_at=start, first_step=1,
        first_step_at=start + 10, last_step=80, last_progress_at=start + 89)])
    finish_run(Journal(PlainReporter(err=io.StringIO(), out=io.StringIO()), record), "INFRA_ERROR", "cluster lost")
    saved = load_run("r-k")
    assert saved is not None
    assert saved.finished_at is not None
    kept = saved.events[-1].details["seconds_by_cause"]
    assert (set(kept), kept["startup"], kept["productive"]) == ({"startup", "productive", "lost_to_end"}, 10, 79)
    assert sum(kept.values()) == pytest.approx(saved.finished_at - start, rel=0.01)
