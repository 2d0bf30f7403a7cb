"""The health watcher on a real kept local cluster (runs submitted with --cluster): a run heals from a
failure or a hang and resumes from its last checkpoint, and an exporter that stops answering is reported
and is never a reason to restart. The runs that end without succeeding (the same failure twice, a hang
the policy stops, a stop or a deadline during a backoff) are tests/test_launcher_run_ends.py's; the
faults a run heals from, on clusters of their own, are the healing drill's (tests/test_heal_drill.py).

All but the last test take runs on the suite's shared cluster (tests/conftest.py's `shared_cluster`: a
worker with one simulated GPU; their run ids start with `heal-`). They mostly wait (a failure, a hang and
the restart after each), so both are head starts (tests/launcher_support.py's SharedCluster): submitted when
the shared cluster starts, going on beside the other tests on it, taken last. The last test kills a
worker's exporter, so it has a cluster of its own.

Run under `flock /tmp/raypulse-ray.lock`.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_until
from tests.launcher_support import SharedCluster, kept_cluster, launcher, start_launcher, status_json

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

FAST = ["--health-check-interval", "1", "--hang-after", "6"]
# Reports five steps, then hangs (the driver stays alive: a stuck collective, say).
HANGS = ("python -c 'import time, ray\nfrom exporter import progress\nray.init()\n"
         "for step in range(1, 10**6):\n    progress.report(step, loss=1.0)\n"
         "    if step == 5:\n        progress.flush()\n        time.sleep(3600)\n    time.sleep(0.2)'")

# Reports five steps, then hangs, without ever calling ray.init() (a plain script, or torchrun's ranks):
# Ray sees no driver, actor or task of it; its processes are the entrypoint's tree.
PLAIN_HANG = ("python -c 'import time\nfrom exporter import progress\n"
              "for step in range(1, 6):\n    progress.report(step, loss=1.0)\n    time.sleep(0.2)\n"
              "progress.flush()\ntime.sleep(3600)'")
EXAMPLES = str(REPO / "examples")
HEAD_START = {
    "heal-resume-1": ("--working-dir", EXAMPLES, "--max-retries", "1", "--retry-backoff", "1", "--",
                      "python train.py --steps 30 --checkpoint-every 10 --fail-at-step 25 --step-seconds 0.05"),
    "heal-train-v2-1": ("--working-dir", EXAMPLES, *FAST, "--hang-after", "10", "--retry-backoff", "1", "--",
                        "python train_ray_train.py --workers 1 --steps 30 --checkpoint-every 10 --step-seconds 0.1 "
                        "--hang-at-step 15"),
}
FINISH_S = 280  # the most either may still take when its test comes (they started with the cluster)


@pytest.fixture(scope="module")
def home(shared_launcher_home: Path) -> Path:
    return shared_launcher_home  # where the shared cluster is known


@pytest.fixture(scope="module")
def own_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("raypulse-home")


@pytest.fixture(scope="module")
def own(own_home: Path) -> Iterator[dict]:
    """A cluster of this module's own (one worker, no GPU), for the test that kills its worker's exporter."""
    with kept_cluster("healing", own_home) as record:
        yield record


def state_of(run_id: str, home: Path) -> str | None:
    """The run's state, or None while it is not recorded yet."""
    result = launcher("status", run_id, "-o", "json", home=home)
    return json.loads(result.stdout)["state"] if result.returncode == 0 else None


def kinds(record: dict) -> list[str]:
    return [event["kind"] for event in record["events"]]


def test_the_example_resumes_from_its_last_checkpoint(home: Path, shared_cluster: SharedCluster):
    result = shared_cluster.finish("heal-resume-1", timeout=FINISH_S)
    assert result.returncode == 0, result.stderr
    checkpoints = home / "runs" / "heal-resume-1" / "checkpoints"
    assert f"attempt 2 resumes from step 20 ({checkpoints / 'step-000020.json'})" in result.stdout
    assert "attempt 2 resumes from the checkpoint of step 20" in result.stderr  # what the launcher told it
    assert (checkpoints / "raypulse-checkpoint.json").exists()
    assert "step   30" in result.stdout


def test_ray_train_resumes_itself_after_a_hang(home: Path, shared_cluster: SharedCluster):
    result = shared_cluster.finish("heal-train-v2-1", timeout=FINISH_S)
    assert result.returncode == 0, result.stderr
    assert "attempt 1: hang (rank 0 made no progress for" in result.stderr
    assert "rank 0: resumed from step 10" in result.stdout  # Ray Train's own resume, same storage and name
    record = status_json("heal-train-v2-1", home)
    assert [attempt["status"] for attempt in record["attempts"]] == ["STOPPED", "SUCCEEDED"]


def test_an_exporter_that_stops_answering_is_reported_never_a_restart(own_home: Path, own: dict):
    """On the module's own cluster: it leaves the worker without its exporter."""
    steps = ("python -c 'import time\nfrom exporter import progress\n"
             "for step in range(1, 80):\n    progress.report(step, loss=1.0)\n    time.sleep(0.25)\n"
             "progress.flush()'")
    process = start_launcher("submit", "--cluster", "healing", "--run-id", "blind-1", *FAST, "--", steps,
                             home=own_home)
    worker_exporter = next(p for p in own["processes"] if p["role"] == "exporter" and p["node"] != "head")
    wait_until(lambda: state_of("blind-1", own_home) == "RUNNING", 60, "the job to run")
    os.kill(worker_exporter["pid"], signal.SIGKILL)
    assert process.wait(120) == 0, process.stderr.read()
    record = status_json("blind-1", own_home)
    assert len(record["attempts"]) == 1
    assert "health.fault" not in kinds(record)
    [event] = [event for event in record["events"] if event["kind"] == "health.exporter_unreachable"]
    assert event["details"]["node"] == "workers-1"
