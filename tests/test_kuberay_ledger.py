"""The goodput ledger on KubeRay: a RayJob followed to its end against our fake API server with KubeRay's
state machine (tests/fake_kube.py), through the real kubernetes client and the real CLI. The run's end
keeps its seconds per cause, and they add up to its wall time; the time Kueue holds the RayJob (before it
first runs, and after a preemption until it is admitted again) is queued."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from exporter.contract import wire
from launcher.ledger import ledger, queue_waits
from launcher.state import RunRecord
from tests.conftest import wait_until
from tests.fake_kube import Attempt, FakeApiServer, launcher, launcher_env, launching

pytest.importorskip("kubernetes")

NAMESPACE = "team-a"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def server(ca: trustme.CA) -> Iterator[FakeApiServer]:
    with FakeApiServer(ca) as server:
        server.scripts["ledger-ok"] = [Attempt("FAILED", ["first try"], until_followed=True),
                                       Attempt("SUCCEEDED", ["second try"])]
        server.scripts["ledger-failed"] = [Attempt("FAILED", ["no luck"])]
        yield server


@pytest.fixture
def env(tmp_path: Path, ca: trustme.CA, server: FakeApiServer) -> dict[str, str]:
    return launcher_env(tmp_path, ca, server, NAMESPACE)



def _finished(env: dict[str, str], run_id: str) -> tuple[RunRecord, dict]:
    shown = launcher(env, "status", run_id, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    record = RunRecord.model_validate(json.loads(shown.stdout))
    [end] = [event.details for event in record.events if event.kind == "run.finished"]
    assert set(end["seconds_by_cause"]) <= set(wire.RUN_TIME_CAUSES)
    return record, {cause: end["seconds_by_cause"].get(cause, 0.0) for cause in wire.RUN_TIME_CAUSES}  # zeros left out


@pytest.mark.parametrize(("run_id", "flags", "code", "state"), [
    ("ledger-ok", ("--max-retries", "1"), 0, "SUCCEEDED"),
    ("ledger-failed", (), 1, "FAILED"),
])
def test_a_kuberay_runs_causes_add_up_to_its_wall_time(env: dict[str, str], run_id: str, flags: tuple[str, ...],
                                                        code: int, state: str):
    result = launcher(env, "submit", "--backend", "kuberay", "--run-id", run_id, *flags, "--", "python train.py")
    assert result.returncode == code, result.stderr
    record, split = _finished(env, run_id)
    assert record.state == state
    wall = record.finished_at - record.created_at
    assert sum(split.values()) == pytest.approx(wall, rel=0.01)
    again = ledger(record)  # the record alone says the same, later (status, the report)
    assert sum(again.seconds.values()) == pytest.approx(wall)
    # The run's end: `finish_run` took the ledger a moment before `run.finished` read the clock for the record's
    # end, and that moment (however long a busy machine makes it) is the last cause's, teardown's (the event
    # keeps milliseconds).
    assert -0.001 <= again.seconds["stopping"] - split["stopping"] < 1
    assert {cause: seconds for cause, seconds in again.seconds.items() if cause != "stopping"} == pytest.approx(
        {cause: seconds for cause, seconds in split.items() if cause != "stopping"}, abs=0.01)
    assert again.seconds["productive"] == 0  # the fake's job reports no step: no progress was made
    assert again.seconds["lost_to_end"] == 0  # no step was made: nothing after one to lose
    assert "time      " in launcher(env, "status", run_id).stdout


def _shown(env: dict[str, str], run_id: str) -> RunRecord | None:
    shown = launcher(env, "status", run_id, "-o", "json")
    return RunRecord.model_validate(json.loads(shown.stdout)) if shown.returncode == 0 else None


def _has(env: dict[str, str], run_id: str, **fields: object) -> bool:
    record = _shown(env, run_id)
    return record is not None and all(getattr(record, name) == value for name, value in fields.items())


def _time_line(env: dict[str, str], run_id: str) -> str:
    shown = launcher(env, "status", run_id)
    return next((line for line in shown.stdout.splitlines() if line.startswith("time      ")), "")


def _queued_now(env: dict[str, str], run_id: str, waits: int) -> bool:
    """The run's record says it waits in the queue, for the `waits`-th time, and `launcher status` shows it."""
    record = _shown(env, run_id)
    if record is None or len(queue_waits(record.events)) != waits or queue_waits(record.events)[-1][1] is not None:
        return False
    return "queued " in _time_line(env, run_id)


def _submit_queued(env: dict[str, str], run_id: str):
    return launching(env, "submit", "--backend", "kuberay", "--run-id", run_id, "--queue", "team-nlp",
                     "--max-retries", "0", "--", "python train.py")


def test_a_run_kueue_holds_is_queued_until_it_is_admitted(env: dict[str, str], server: FakeApiServer):
    server.scripts["ledger-queued"] = [Attempt("SUCCEEDED", ["trained"])]
    process = _submit_queued(env, "ledger-queued")
    try:  # Kueue's webhook created it suspended: queued (and shown so) until the test admits it
        wait_until(lambda: _queued_now(env, "ledger-queued", 1), 60, "`launcher status` to show the run queued")
        admitted_at = time.time()
        server.admit(NAMESPACE, "ledger-queued")
        assert process.wait(60) == 0, process.stderr.read()
    finally:
        process.kill()
    record, split = _finished(env, "ledger-queued")
    [(queued, admitted)] = queue_waits(record.events)
    assert admitted is not None
    assert admitted >= admitted_at  # said once Kueue let it go, not before
    assert record.attempts[0].submitted_at >= admitted  # the attempt is KubeRay's, after the admission
    assert split["queued"] == pytest.approx(admitted - queued, abs=0.01)  # the whole wait, and only it
    assert split["queued"] >= admitted_at - queued
    wall = record.finished_at - record.created_at
    assert sum(split.values()) == pytest.approx(wall, rel=0.01)
    assert sum(ledger(record).seconds.values()) == pytest.approx(wall)
    assert _time_line(env, "ledger-queued") == f"time      {ledger(record).line()}"
    assert "queued " in _time_line(env, "ledger-queued")
    kinds = [event.kind for event in record.events]
    assert (kinds.count("run.queued"), kinds.count("run.admitted")) == (1, 1)  # one event per change


def test_the_wait_after_a_preemption_until_kueue_admits_the_run_again_is_queued(env: dict[str, str],
                                                                                server: FakeApiServer):
    server.scripts["ledger-preempted"] = [Attempt("HOLD", ["first"]), Attempt("SUCCEEDED", ["second"])]
    process = _submit_queued(env, "ledger-preempted")
    try:
        wait_until(lambda: _queued_now(env, "ledger-preempted", 1), 60, "the run to be queued")
        server.admit(NAMESPACE, "ledger-preempted")
        wait_until(lambda: _has(env, "ledger-preempted", state="RUNNING"), 60, "the first attempt to run")
        server.preempt(NAMESPACE, "ledger-preempted")
        wait_until(lambda: _queued_now(env, "ledger-preempted", 2), 60, "the preempted run to be queued again")
        readmitted_at = time.time()
        server.admit(NAMESPACE, "ledger-preempted")
        assert process.wait(60) == 0, process.stderr.read()
    finally:
        process.kill()
    record, split = _finished(env, "ledger-preempted")
    assert [(item.attempt, item.status) for item in record.attempts] == [(1, "STOPPED"), (2, "SUCCEEDED")]
    first, second = queue_waits(record.events)
    assert first[1] is not None
    assert second[1] is not None
    assert second[1] >= readmitted_at
    assert first[1] <= record.attempts[0].submitted_at  # KubeRay's cluster start after the admission is not queued
    assert second[0] >= record.attempts[0].ended_at  # the preempted attempt's own time is not queued
    assert split["queued"] == pytest.approx(first[1] - first[0] + second[1] - second[0], abs=0.01)
    wall = record.finished_at - record.created_at
    assert sum(split.values()) == pytest.approx(wall, rel=0.01)
    assert sum(ledger(record).seconds.values()) == pytest.approx(wall)


def test_a_run_nothing_follows_is_queued_as_status_finds_it(env: dict[str, str], server: FakeApiServer):
    """--no-wait: `launcher status` reads the RayJob (catch_up) and says the wait as it sees it: queued while
    Kueue holds it, admitted from the first look after Kueue let it go."""
    server.scripts["ledger-left"] = [Attempt("SUCCEEDED", ["trained"])]
    result = launcher(env, "submit", "--backend", "kuberay", "--run-id", "ledger-left", "--queue", "team-nlp",
                      "--no-wait", "--", "python train.py")
    assert result.returncode == 0, result.stderr
    wait_until(lambda: _queued_now(env, "ledger-left", 1), 60, "`launcher status` to show the run queued")
    admitted_at = time.time()
    server.admit(NAMESPACE, "ledger-left")
    wait_until(lambda: _has(env, "ledger-left", exit_code=0), 60, "the run to succeed")
    record, split = _finished(env, "ledger-left")
    [(queued, admitted)] = queue_waits(record.events)
    assert admitted is not None
    assert admitted >= admitted_at
    assert split["queued"] == pytest.approx(admitted - queued, abs=0.01)
    assert sum(split.values()) == pytest.approx(record.finished_at - record.created_at, rel=0.01)
