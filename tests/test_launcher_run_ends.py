"""Runs that end without succeeding, on the suite's shared kept cluster: a run that fails the same way
twice stops early with its own exit code; a hang the policy stops ends UNHEALTHY with the stacks of its
processes kept for `launcher diagnose` (with ray.init() and without); a stop or a deadline during a
restart's backoff ends the run cleanly. (tests/test_launcher_healing.py has the runs that heal.)

Each run mostly waits (a backoff, a hang threshold, a deadline) and uses none of the worker's resources
(its entrypoint runs on the head): all five are head starts (tests/launcher_support.py's SharedCluster),
submitted when the shared cluster starts, going on beside the other tests on it; the tests here run last
on it and check how each ended.

Run under `flock /tmp/raypulse-ray.lock`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.launcher_support import SharedCluster, launcher, status_json
from tests.test_launcher_healing import FAST, HANGS, PLAIN_HANG, kinds

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

LONG_BACKOFF_S = 3600  # past the shared cluster's whole life (its tests' timeouts together)
# Past the hang (seen about 10 s after the job starts; more while the other head starts begin beside it), within
# the backoff that follows it (the default cap): the run waits out neither, so it costs the suite nothing.
DEADLINE_S = 120
DEADLINE_BACKOFF_S = 300
HEAD_START = {
    "ends-same-1": ("--max-retries", "3", "--retry-backoff", "1", "--", "echo broken; exit 3"),
    "ends-hung-1": (*FAST, "--on-hang", "stop", "--", HANGS),
    "ends-plain-1": (*FAST, "--on-hang", "stop", "--", PLAIN_HANG),
    "ends-late-1": (*FAST, "--retry-backoff", str(DEADLINE_BACKOFF_S), "--active-deadline-seconds", str(DEADLINE_S),
                    "--", HANGS),
    # In its backoff until its test stops it, whenever that test comes.
    "ends-stopped-1": (*FAST, "--retry-backoff", str(LONG_BACKOFF_S), "--retry-backoff-max", str(LONG_BACKOFF_S), "--",
                       HANGS),
}
FINISH_S = 240  # the most any of them may still take when its test comes (they started with the cluster)


@pytest.fixture(scope="module")
def home(shared_launcher_home: Path) -> Path:
    return shared_launcher_home  # where the shared cluster is known


def test_a_run_failing_the_same_way_stops_early_with_its_own_exit_code(home: Path, shared_cluster: SharedCluster):
    result = shared_cluster.finish("ends-same-1", timeout=FINISH_S)
    assert result.returncode == 6, result.stderr
    record = status_json("ends-same-1", home)
    assert (record["state"], len(record["attempts"])) == ("REPEATED_FAILURE", 2)  # not 4: retrying won't help
    assert "attempts 1 and 2 failed the same way" in record["reason"]
    assert "retrying would not help" in result.stderr


def test_a_hang_the_policy_stops_is_unhealthy_with_its_stacks_kept(home: Path, shared_cluster: SharedCluster):
    result = shared_cluster.finish("ends-hung-1", timeout=FINISH_S)
    assert result.returncode == 7, result.stderr
    assert "attempt 1: hang (rank 0 made no progress for" in result.stderr
    assert "stopping the run (the health policy says stop)" in result.stderr
    record = status_json("ends-hung-1", home)
    assert record["state"] == "UNHEALTHY"
    assert record["reason"].endswith("health.on_hang is stop")
    assert kinds(record).count("health.fault") == 1
    assert "retry.scheduled" not in kinds(record)
    [stacks] = [event for event in record["events"] if event["kind"] == "health.stacks"]
    assert stacks["details"]["taken"] >= 1, stacks
    shown = launcher("diagnose", "ends-hung-1", "--saved", home=home)
    assert shown.returncode == 0, shown.stderr
    assert "1 in <module> (<string>:8)" in shown.stdout  # the driver's frame: line 8 of HANGS, its sleep
    assert "driver" in shown.stdout
    text = launcher("status", "ends-hung-1", home=home).stdout
    assert "health.fault" in text
    assert "health.stacks" in text


def test_a_hang_without_ray_init_has_the_stacks_of_its_entrypoint(home: Path, shared_cluster: SharedCluster):
    result = shared_cluster.finish("ends-plain-1", timeout=FINISH_S)
    assert result.returncode == 7, result.stderr
    record = status_json("ends-plain-1", home)
    [stacks] = [event for event in record["events"] if event["kind"] == "health.stacks"]
    assert stacks["details"]["taken"] >= 1, stacks
    shown = launcher("diagnose", "ends-plain-1", "--saved", home=home)
    assert shown.returncode == 0, shown.stderr
    assert "1 in <module> (<string>:7)" in shown.stdout  # the script's sleep, line 7 of PLAIN_HANG
    assert "entrypoint -c" in shown.stdout


def test_a_stop_during_a_restarts_backoff_ends_the_run_cleanly(home: Path, shared_cluster: SharedCluster):
    wait_until(lambda: "retry.scheduled" in kinds(status_json("ends-stopped-1", home)), FINISH_S,
               "the restart's backoff", interval=1)
    stopped = launcher("stop", "ends-stopped-1", home=home)
    assert stopped.returncode == 0, stopped.stderr
    result = shared_cluster.finish("ends-stopped-1", timeout=60)
    assert result.returncode == 3, result.stderr
    assert f"stopped (hang); attempt 2 in {LONG_BACKOFF_S}s" in result.stderr  # it was in the backoff
    record = status_json("ends-stopped-1", home)
    assert (record["state"], len(record["attempts"])) == ("STOPPED", 1)
    assert record["attempts"][0]["status"] == "STOPPED"


def test_a_deadline_during_a_restarts_backoff_ends_the_run(home: Path, shared_cluster: SharedCluster):
    result = shared_cluster.finish("ends-late-1", timeout=FINISH_S)
    assert result.returncode == 4, result.stderr
    record = status_json("ends-late-1", home)
    assert (record["state"], len(record["attempts"])) == ("DEADLINE_EXCEEDED", 1)
    assert record["reason"] == f"active_deadline_seconds ({DEADLINE_S}s) passed"
    events = kinds(record)
    assert "retry.scheduled" in events[:events.index("run.deadline")]  # it passed during the backoff
