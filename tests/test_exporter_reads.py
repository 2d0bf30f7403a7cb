"""The launcher's reads of exporters (launcher/health/exporters.py) against real servers that answer as a
dying, slow or hostile exporter does: every read ends within its deadline with an error that says why,
never an exception and never unbounded memory; the health check turns whatever goes wrong into an event
and the next check runs; the recorder skips a bad target for the round and records the good ones.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.contract import wire
from launcher import recording
from launcher.display import PlainReporter
from launcher.healing import Healing
from launcher.health.exporters import MAX_INFLATED_BYTES, Target, read
from launcher.health.policy import HealthPolicy
from launcher.journal import Journal
from launcher.state import RunRecord
from tests import broken_exporters as broken
from tests.broken_exporters import TRAIN_STEP, ExporterLike, RawServer
from tests.conftest import wait_until

DEADLINE_S = 1.0


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYPULSE_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def good() -> Iterator[ExporterLike]:
    with ExporterLike(TRAIN_STEP) as server:
        yield server


def serve(answer: broken.Answer) -> RawServer:
    return RawServer(answer)


# --- one read -----------------------------------------------------------------------------------------


def test_a_body_cut_short_of_its_content_length_is_an_error_not_an_exception():
    with serve(broken.cut_short) as server:
        result = read(Target("workers-1", server.url), DEADLINE_S)
    assert not result.ok
    assert "cut short" in result.error


def test_a_small_gzip_body_that_inflates_past_the_cap_is_refused_without_inflating_it():
    inflated = 8 * MAX_INFLATED_BYTES
    with serve(broken.gzip_bomb(inflated)) as server:
        tracemalloc.start()
        try:
            result = read(Target("workers-1", server.url), 10)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert not result.ok
    assert "inflates past" in result.error
    assert server.sent < inflated / 100  # it was small on the wire
    assert peak < 2 * MAX_INFLATED_BYTES  # and never grew to what it inflates to


@pytest.mark.parametrize("answer", [broken.trickle_body, broken.trickle_headers], ids=["body", "headers"])
def test_a_trickle_cannot_hold_a_read_past_its_deadline(answer: broken.Answer):
    with serve(answer) as server:
        started = time.monotonic()
        result = read(Target("workers-1", server.url), DEADLINE_S)
        took = time.monotonic() - started
    assert not result.ok
    assert f"within {DEADLINE_S:g}s" in result.error
    assert took < DEADLINE_S + 10  # the whole trickle takes 20 s; generous, so that load cannot flake it
    assert server.sent < 200  # what the read let in: the head and a few bytes, never the whole trickle


@pytest.mark.parametrize("answer", [broken.not_http, broken.not_gzip, broken.not_an_exposition, broken.bad_chunks],
                         ids=["not-http", "not-gzip", "not-an-exposition", "bad-chunks"])
def test_garbage_is_an_error_that_says_so(answer: broken.Answer):
    with serve(answer) as server:
        result = read(Target("workers-1", server.url), DEADLINE_S)
    assert not result.ok
    assert result.error
    assert result.error.isprintable()  # it goes into the journal as it is


def test_a_good_exporter_reads_as_before(good: ExporterLike):
    result = read(Target("head", good.url), DEADLINE_S)
    assert result.ok, result.error
    assert [(s.name, s.value) for s in result.samples] == [("raypulse_train_step", 7.0)]


# --- the health check -----------------------------------------------------------------------------------


def healing(home: Path, targets) -> tuple[Healing, RunRecord]:
    record = RunRecord(run_id="r-1", name="r", backend="local", max_attempts=2)
    journal = Journal(PlainReporter(), record)
    policy = HealthPolicy(check_interval_seconds=0.5, hang_after_seconds=60, stacks=False)
    heal = Healing(policy, journal, targets)
    journal.emit("attempt.submitted", attempt=1, submission_id="r-1-a1", address="http://h", entrypoint="x")
    heal.watch(1, "r-1-a1")
    return heal, record


def kinds(record: RunRecord) -> list[str]:
    return [event.kind for event in record.events if event.kind.startswith("health.")]


def test_a_check_that_meets_a_broken_exporter_reports_it_unreachable_and_raises_nothing(home: Path,
                                                                                      good: ExporterLike):
    with serve(broken.cut_short) as bad:
        heal, record = healing(home, lambda: [Target("head", good.url), Target("workers-1", bad.url)])
        assert heal.check() is None
    [event] = [event for event in record.events if event.kind == "health.exporter_unreachable"]
    assert event.details["node"] == "workers-1"
    assert "cut short" in event.details["error"]


def test_a_check_that_fails_is_an_event_said_once_and_the_next_check_runs(home: Path, good: ExporterLike):
    listed = home / "exporters.json"  # where the targets come from: unreadable for two checks

    def targets() -> list[Target]:
        return [Target(**target) for target in json.loads(listed.read_text())]

    heal, record = healing(home, targets)
    for _ in range(2):
        wait_until(heal.watcher.due, 5, "the next check")
        assert heal.check() is None
    assert kinds(record) == ["health.check_failed"]  # said once while it keeps failing
    assert "FileNotFoundError" in record.events[-1].details["error"]
    listed.write_text(json.dumps([{"node": "head", "url": good.url}]))
    wait_until(heal.watcher.due, 5, "the next check")
    assert heal.check() is None
    assert heal.watcher.last is not None
    assert [read.ok for read in heal.watcher.last.reads] == [True]


# --- the recorder ---------------------------------------------------------------------------------------


def test_a_recorder_round_skips_bad_targets_records_the_good_ones_and_goes_on(tmp_path: Path, good: ExporterLike):
    said: list[tuple[str, dict]] = []
    bad = [serve(broken.cut_short), serve(broken.gzip_bomb(2 * MAX_INFLATED_BYTES)), serve(broken.not_http),
           serve(broken.not_an_exposition)]
    try:
        good.list_target(good.address, "head")
        for index, server in enumerate(bad):
            good.list_target(server.address, f"workers-{index}")
        rec = recording.Recorder(tmp_path, good.url + wire.SD_PATH, interval=3600,
                                 notify=lambda kind, details: said.append((kind, dict(details)))).start()
        wait_until(lambda: rec.rounds >= 1, 10, "the recorder's first round")
        rec.record_once()
        rec.stop()
    finally:
        for server in bad:
            server.close()
    assert rec.ended == "stopped"
    saved = recording.read(tmp_path)
    ups = {series.labels["node"]: series.values for series in saved.select("up")}
    assert ups == {"head": [1.0] * saved.rounds, **{f"workers-{i}": [0.0] * saved.rounds for i in range(len(bad))}}
    assert saved.rounds >= 2
    [step] = saved.select("raypulse_train_step")
    assert step.values == [7.0] * saved.rounds
    failed = sorted(details["node"] for kind, details in said if kind == "recording.target_failed")
    assert failed == [f"workers-{i}" for i in range(len(bad))]  # once each, not once per round
