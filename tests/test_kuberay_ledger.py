"""The goodput ledger on KubeRay: a RayJob followed to its end against our fake API server with KubeRay's
state machine (tests/fake_kube.py), through the real kubernetes client and the real CLI. The run's end
keeps its seconds per cause, and they add up to its wall time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from exporter.contract import wire
from launcher.ledger import ledger
from launcher.state import RunRecord
from tests.fake_kube import Attempt, FakeApiServer, launcher, launcher_env

pytest.importorskip("kubernetes")

NAMESPACE = "team-a"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    ca = trustme.CA()
    with FakeApiServer(ca) as server:
        server.scripts["ledger-ok"] = [Attempt("FAILED", ["first try"], until_followed=True),
                                       Attempt("SUCCEEDED", ["second try"])]
        server.scripts["ledger-failed"] = [Attempt("FAILED", ["no luck"])]
        yield launcher_env(tmp_path, ca, server, NAMESPACE)



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
    assert again.seconds == pytest.approx(split, abs=0.01)
    assert again.seconds["productive"] == 0  # the fake's job reports no step: no progress was made
    assert again.seconds["lost_to_end"] == 0  # no step was made: nothing after one to lose
    assert "time      " in launcher(env, "status", run_id).stdout
