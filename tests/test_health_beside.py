"""The health checks run beside the run's follow loop: the loop never waits for a check, checks run while it
polls and stop when it pauses, and a check longer than its interval is said (health.check_slow), not a lost
cluster."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from launcher.display import PlainReporter
from launcher.healing import Healing
from launcher.health.exporters import Target
from launcher.health.faults import Fault
from launcher.health.policy import HealthPolicy
from launcher.journal import Journal
from launcher.state import RunRecord
from tests.broken_exporters import TRAIN_STEP, ExporterLike
from tests.conftest import wait_until


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    return tmp_path


def healing(targets, interval: float = 0.5) -> tuple[Healing, RunRecord]:
    record = RunRecord(run_id="r-1", name="r", backend="local", max_attempts=2)
    journal = Journal(PlainReporter(), record)
    policy = HealthPolicy(check_interval_seconds=interval, hang_after_seconds=60, stacks=False)
    heal = Healing(policy, journal, targets)
    journal.emit("attempt.submitted", attempt=1, submission_id="r-1-a1", address="http://h", entrypoint="x")
    heal.watch(1, "r-1-a1")
    return heal, record


def test_a_slow_check_never_holds_the_poll_and_is_said_once(home: Path):
    listed = threading.Event()

    def slow_targets() -> list[Target]:  # the first listing of exporters takes three check intervals
        if not listed.is_set():
            listed.set()
            time.sleep(1.5)
        return []

    heal, record = healing(slow_targets)
    try:
        polls = []
        until = time.monotonic() + 2.5
        while time.monotonic() < until:
            began = time.monotonic()
            assert heal.poll({"job_id": None}) is None
            polls.append(time.monotonic() - began)
            time.sleep(0.05)
        wait_until(lambda: any(event.kind == "health.check_slow" for event in record.events), 5, "check_slow")
    finally:
        heal.close()
    # The poll returns what is decided; it never runs a check itself (a check here took 1.5 s).
    assert max(polls) < 1.0
    slow = [event for event in record.events if event.kind == "health.check_slow"]
    assert len(slow) == 1
    assert slow[0].details["interval"] == 0.5


def test_checks_run_beside_the_loop_while_it_polls_and_stop_when_it_pauses(home: Path):
    with ExporterLike(TRAIN_STEP) as server:
        heal, record = healing(lambda: [Target("head", server.url)])
        try:
            heal.poll(None)
            wait_until(lambda: heal.watcher.last is not None, 10, "a check beside the loop")
            assert heal.watcher.last is not None
            assert [read.ok for read in heal.watcher.last.reads] == [True]
            heal.pause()
            with heal._checking:  # a check already under way ends (every check holds this lock)
                checked = heal.watcher.last
            time.sleep(1.2)  # two intervals: paused, no check runs
            assert heal.watcher.last is checked
        finally:
            heal.close()
    assert not [event for event in record.events if event.kind == "health.check_failed"]


class Changes:
    """A node remedy that says when an attempt change begins (Healing.watch asks it first)."""

    def __init__(self) -> None:
        self.began = threading.Event()

    def dead_nodes(self) -> list[str]:
        return []

    def take_out(self, node: str, fault: Fault, for_good: bool) -> tuple[str, dict]:
        return "node.left", {}

    def before_attempt(self, record: RunRecord) -> None:
        self.began.set()


def test_a_check_in_flight_across_an_attempt_change_lands_on_the_attempt_it_read(home: Path):
    """A check of attempt 1 held open while attempt 2 starts: its fault is attempt 1's (journalled so, never
    handed to the loop as attempt 2's, which would restart a healthy attempt)."""
    held, release = threading.Event(), threading.Event()
    with ExporterLike("") as server:
        def targets() -> list[Target]:
            if not held.is_set():  # the first check is held open until the test lets it go
                held.set()
                release.wait(30)
            return [Target("node-a", server.url)]

        record = RunRecord(run_id="r-1", name="r", backend="local", max_attempts=2)
        journal = Journal(PlainReporter(), record)
        changes = Changes()
        heal = Healing(HealthPolicy(check_interval_seconds=0.5, hang_after_seconds=60, stacks=False), journal,
                       targets, remedy=changes)
        journal.emit("attempt.submitted", attempt=1, submission_id="r-1-a1", address="http://h", entrypoint="x")
        heal.watch(1, "r-1-a1")
        server.text = f'raypulse_gpu_xid_last_timestamp_seconds{{gpu="0",uuid="GPU-0a",xid="79"}} {time.time():.3f}\n'
        try:
            changes.began.clear()
            heal.running(time.time())
            assert heal.poll(None) is None  # the checks start beside the loop
            wait_until(held.is_set, 10, "the check of attempt 1 to be under way")
            journal.emit("attempt.submitted", attempt=2, submission_id="r-1-a2", address="http://h", entrypoint="x")
            change = threading.Thread(target=heal.watch, args=(2, "r-1-a2"))
            change.start()
            wait_until(changes.began.is_set, 10, "the attempt change to begin")
            # Unfixed, the change swaps the attempt under the check now; fixed, it waits for the check.
            deadline = time.monotonic() + 1
            while time.monotonic() < deadline and heal.watcher.attempt.number != 2:
                time.sleep(0.01)
            release.set()
            change.join(30)
            assert not change.is_alive()
            faults = [event for event in record.events if event.kind == "health.fault"]
            assert [(event.attempt, event.details["fault"]) for event in faults] == [(1, "gpu_fault")]
            assert heal.poll(None) is None  # nothing decided for attempt 2: it is not restarted
            assert heal.stopped_by is None
        finally:
            release.set()
            heal.close()
    assert not [event for event in record.events if event.kind == "health.recovered"]


def test_a_check_whose_bookkeeping_fails_still_acts_on_its_fault(home: Path, monkeypatch: pytest.MonkeyPatch):
    """The faults a check read are acted on even when keeping the attempt's progress facts raises: the XID is
    read once, so losing it to the books would leave a faulty GPU under the run."""
    with ExporterLike(TRAIN_STEP) as server:
        heal, record = healing(lambda: [Target("node-a", server.url)])
        server.text = TRAIN_STEP + f'raypulse_gpu_xid_last_timestamp_seconds{{gpu="0",uuid="GPU-0a",xid="79"}} ' \
            f'{time.time():.3f}\n'  # after the attempt began: its fault

        def broken(*args, **kwargs) -> None:
            raise RuntimeError("the books are broken")

        monkeypatch.setattr(heal, "_note_progress", broken)
        heal.running(time.time())
        fault = heal.check()
    assert fault is not None
    assert fault.kind.value == "gpu_fault"
    assert [(event.kind, event.details.get("fault")) for event in record.events if event.kind.startswith("health.")] \
        == [("health.check_failed", None), ("health.fault", "gpu_fault")]
    assert "the books are broken" in record.events[-2].details["error"]
