"""What a healed fault cost, as the run reports it (launcher/healing.py): steps lost are the last step
before the fault less the checkpoint step the next attempt resumed from, and the recovery ends at the
first step the job made, when it made it, as the exporter serves them (raypulse_train_first_step,
raypulse_train_first_progress_time_seconds), not at whichever later step a check happened to see.

The exporter here is an HTTP server on 127.0.0.1 serving the exporter's own rendering of its progress
store (exporter/progress/store.py through the train collector's series), fed the reports a job sends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.collectors.ray.train import emit_rank
from exporter.config import ProgressSettings
from exporter.contract import wire
from exporter.framework.snapshot import SampleSink
from exporter.progress.store import ProgressStore, parse_batch
from exporter.serving.exposition import Format, encode
from launcher.display import PlainReporter
from launcher.healing import Healing, Pending
from launcher.health.exporters import Target
from launcher.health.faults import Fault
from launcher.health.policy import FaultClass, HealthPolicy
from launcher.journal import Journal
from launcher.ledger import steps_lost
from launcher.state import RunRecord
from tests.broken_exporters import ExporterLike
from tests.conftest import wait_until

RUN = "r-1"


class Exporter:
    """A progress store behind an HTTP /metrics, as a node's exporter keeps and serves it."""

    def __init__(self, server: ExporterLike) -> None:
        self.server = server
        self.store = ProgressStore(ProgressSettings())

    def send(self, *reports: dict) -> None:
        self.store.apply(parse_batch({"reports": list(reports)}))
        sink = SampleSink("train")
        for (job_id, submission_id), ranks in self.store.view().jobs.items():
            for rank, state in ranks.items():
                emit_rank(sink, state, job_id=job_id, submission_id=submission_id, rank=rank)
        self.server.text = b"".join(encode(Format.TEXT, sink.freeze(0.0))).decode()

    def steps(self, attempt: int, steps: range, checkpoint_at: int | None = None) -> float:
        """Rank 0 of the attempt reports these steps (and a checkpoint); returns when it made the first."""
        sid, first = f"{RUN}-a{attempt}", time.time()
        for index, step in enumerate(steps):
            self.send({"kind": "progress", "submission_id": sid, "rank": 0, "time": first + index * 0.001,
                       "step": step})
            if step == checkpoint_at:
                self.send({"kind": "checkpoint", "submission_id": sid, "rank": 0, "time": first + index * 0.001,
                           "step": step})
        return first


@pytest.fixture
def exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Exporter]:
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    with ExporterLike() as server:
        yield Exporter(server)


def submitted(journal: Journal, heal: Healing, attempt: int) -> dict[str, str]:
    """What the run does for each attempt: its environment, then the attempt watched."""
    env = heal.attempt_env(attempt)
    journal.emit("attempt.submitted", attempt=attempt, submission_id=f"{RUN}-a{attempt}", address="http://h",
                 entrypoint="python train.py")
    heal.watch(attempt, f"{RUN}-a{attempt}")
    return env


def checked(heal: Healing):
    wait_until(heal.watcher.due, 5, "the next check")
    return heal.check()


def test_a_hang_at_step_35_with_a_checkpoint_at_30_reports_5_steps_lost(exporter: Exporter):
    record = RunRecord(run_id=RUN, name="r", backend="local", max_attempts=3)
    journal = Journal(PlainReporter(), record)
    policy = HealthPolicy(check_interval_seconds=0.5, hang_after_seconds=1.5, stacks=False)
    heal = Healing(policy, journal, lambda: [Target("head", exporter.server.url)])

    submitted(journal, heal, 1)
    exporter.steps(1, range(1, 36), checkpoint_at=30)  # then it hangs at step 35
    fault = None
    deadline = time.monotonic() + 10
    while fault is None and time.monotonic() < deadline:
        fault = checked(heal)
    assert fault is not None
    assert (fault.kind, fault.last_step) == (FaultClass.HANG, 35)

    env = submitted(journal, heal, 2)
    assert json.loads(env[wire.ENV_RESUME_FROM])["step"] == 30
    resumed_at = exporter.steps(2, range(31, 47))  # it resumes at 31, and is at 46 by the next check
    assert checked(heal) is None

    [recovered] = [event for event in record.events if event.kind == "health.recovered"]
    assert recovered.details["steps_lost"] == 5
    assert (recovered.details["first_step"], recovered.details["resumed_from"]) == (31, 30)
    assert recovered.details["recover_seconds"] == round(max(0.0, resumed_at - fault.at), 1)  # the job's own time
    second = record.attempt(2)
    assert (second.first_step, second.first_step_at, second.last_step) == (31, resumed_at, 46)


def test_steps_the_ranks_made_after_the_fault_was_seen_are_redone_too(exporter: Exporter):
    """A NaN seen at step 35; the job makes steps 36-38 before it is stopped: 8 steps redone from the
    checkpoint at 30, as the ranks reported them once more after the attempt ended, not 5."""
    record = RunRecord(run_id=RUN, name="r", backend="local", max_attempts=3)
    journal = Journal(PlainReporter(), record)
    policy = HealthPolicy(check_interval_seconds=0.5, stacks=False)
    heal = Healing(policy, journal, lambda: [Target("head", exporter.server.url)])

    submitted(journal, heal, 1)
    exporter.steps(1, range(1, 35), checkpoint_at=30)
    exporter.send({"kind": "progress", "submission_id": f"{RUN}-a1", "rank": 0, "time": time.time(), "step": 35,
                   "loss": "NaN"})
    fault = checked(heal)
    assert fault is not None
    assert (fault.kind, fault.last_step) == (FaultClass.NONFINITE_LOSS, 35)
    exporter.steps(1, range(36, 39))  # until it was stopped
    heal.last_look()  # the run does this once the attempt ended
    assert record.attempt(1).last_step == 38

    submitted(journal, heal, 2)
    exporter.steps(2, range(31, 40))
    assert checked(heal) is None
    [recovered] = [event for event in record.events if event.kind == "health.recovered"]
    assert (recovered.details["steps_lost"], recovered.details["resumed_from"]) == (8, 30)


def test_the_record_keeps_the_faults_step_when_the_last_look_finds_no_later_one(exporter: Exporter):
    """A lost node found by a check of its own after the attempt failed (fault_after_failure) saw step 25,
    where the attempt's last check saw 20; the last look finds no later step: the record's last step is the
    fault's, so the ledger counts redone steps from where health.recovered does."""
    record = RunRecord(run_id=RUN, name="r", backend="local", max_attempts=3)
    journal = Journal(PlainReporter(), record)
    heal = Healing(HealthPolicy(check_interval_seconds=0.5, stacks=False), journal,
                   lambda: [Target("head", exporter.server.url)])

    submitted(journal, heal, 1)
    exporter.steps(1, range(1, 21), checkpoint_at=15)
    assert checked(heal) is None
    assert record.attempt(1).last_step == 20
    exporter.steps(1, range(21, 26))  # made before the node was lost; no check of the attempt saw them
    heal.pending = Pending(Fault(FaultClass.NODE_LOST, "node lost (w1)", time.time(), "node:w1", "w1", True, 25, {}),
                           time.time())
    heal.last_look()
    assert record.attempt(1).last_step == 25
    assert heal.pending.last_step == 25


def test_steps_reported_after_the_last_look_count_until_the_next_attempts_first_step(exporter: Exporter):
    """A NaN seen at step 35, the attempt stopped; the last look sees 36, but the ranks' reports of 37-38
    reach the exporter later (it serves a report a collector interval after it came; a lost node's peers
    send theirs as they exit). The next attempt's checks read the ended attempt again: 8 steps lost from the
    checkpoint at 30, in health.recovered and in the record the ledger reads."""
    record = RunRecord(run_id=RUN, name="r", backend="local", max_attempts=3)
    journal = Journal(PlainReporter(), record)
    heal = Healing(HealthPolicy(check_interval_seconds=0.5, stacks=False), journal,
                   lambda: [Target("head", exporter.server.url)])

    submitted(journal, heal, 1)
    exporter.steps(1, range(1, 35), checkpoint_at=30)
    exporter.send({"kind": "progress", "submission_id": f"{RUN}-a1", "rank": 0, "time": time.time(), "step": 35,
                   "loss": "NaN"})
    assert checked(heal) is not None
    exporter.steps(1, range(36, 37))
    heal.last_look()
    assert record.attempt(1).last_step == 36
    exporter.steps(1, range(37, 39))  # late

    submitted(journal, heal, 2)
    exporter.steps(2, range(31, 40))
    assert checked(heal) is None
    [recovered] = [event for event in record.events if event.kind == "health.recovered"]
    assert (recovered.details["steps_lost"], recovered.details["resumed_from"]) == (8, 30)
    assert record.attempt(1).last_step == 38


@pytest.mark.parametrize(("last", "resumed_from", "first", "lost"), [
    (35, 30, 31, 5),  # resumed where it was told
    (35, 30, None, 5),  # an exporter that does not serve the first step
    (35, None, 31, 5),  # resumed by itself (Ray Train's own checkpoint)
    (35, 30, 1, 35),  # told to resume, but started over: everything was redone
    (35, None, None, None),  # nothing says where it resumed: unknown, not 0
    (None, 30, 31, None),  # no step before the fault
])
def test_steps_lost_count_from_where_the_next_attempt_resumed(last, resumed_from, first, lost):
    assert steps_lost(last, resumed_from, first) == lost


def test_the_retry_backoff_starts_again_after_an_attempt_that_made_progress():
    from launcher.run import backoff_seconds, failures_in_a_row
    from launcher.spec import build_spec
    from launcher.state import AttemptRecord

    spec = build_spec({"entrypoint": "true", "retry_backoff_seconds": 10, "retry_backoff_max_seconds": 300})
    progressed = AttemptRecord(attempt=2, submission_id="r-a2", resumed_from_step=300, last_step=1521)
    stuck = AttemptRecord(attempt=3, submission_id="r-a3", resumed_from_step=1500, last_step=1500)
    silent = AttemptRecord(attempt=4, submission_id="r-a4")  # a job that reports no progress
    streak = failures_in_a_row(3, progressed)  # three failures before it do not count once it trained
    assert (streak, backoff_seconds(spec, streak)) == (1, 10)
    streak = failures_in_a_row(streak, stuck)  # no step past its checkpoint: the next wait doubles
    assert (streak, backoff_seconds(spec, streak)) == (2, 20)
    streak = failures_in_a_row(streak, silent)
    assert (streak, backoff_seconds(spec, streak)) == (3, 40)
    assert backoff_seconds(spec, 9) == 300  # never past the longest



def test_a_restart_whose_faulty_node_was_taken_out_starts_at_once_the_first_time_in_a_row():
    from launcher.run import failures_in_a_row, retry_delay
    from launcher.spec import build_spec
    from launcher.state import AttemptRecord

    spec = build_spec({"entrypoint": "true", "retry_backoff_seconds": 10})
    trained = AttemptRecord(attempt=2, submission_id="r-a2", resumed_from_step=300, last_step=331)
    stuck = AttemptRecord(attempt=3, submission_id="r-a3", resumed_from_step=300, last_step=300)
    streak = failures_in_a_row(0, trained)
    assert retry_delay(spec, streak, node_taken_out=True) == 0  # the node was replaced: nothing to wait for
    assert retry_delay(spec, streak, node_taken_out=False) == 10  # a hang, a NaN, a failure: the backoff
    streak = failures_in_a_row(streak, stuck)  # it faulted again before a step: a crash loop backs off
    assert retry_delay(spec, streak, node_taken_out=True) == 20
