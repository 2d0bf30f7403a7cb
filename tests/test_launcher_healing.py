"""The health watcher on a real kept local cluster (`launcher up`, runs submitted with --cluster): a run
that fails the same way twice stops early with its own exit code; a hang the policy stops ends
UNHEALTHY with the stacks of its processes kept for `launcher diagnose`; a stop or a deadline during
a restart's backoff ends the run cleanly; an exporter that stops answering is reported and is never
a reason to restart. (The faults a run heals from, on clusters of their own, are the healing drill's:
tests/test_heal_drill.py.)

Run under `flock /tmp/raypulse-ray.lock`.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_until
from tests.launcher_support import kept_cluster, launcher, start_launcher, status_json

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


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("raypulse-home")


@pytest.fixture(scope="module")
def kept(home: Path) -> Iterator[dict]:
    with kept_cluster("healing", home) as record:
        yield record


def state_of(run_id: str, home: Path) -> str | None:
    """The run's state, or None while it is not recorded yet."""
    result = launcher("status", run_id, "-o", "json", home=home)
    return json.loads(result.stdout)["state"] if result.returncode == 0 else None


def kinds(record: dict) -> list[str]:
    return [event["kind"] for event in record["events"]]


def test_a_run_failing_the_same_way_stops_early_with_its_own_exit_code(home: Path, kept: dict):
    result = launcher("submit", "--cluster", "healing", "--run-id", "same-1", "--max-retries", "3", "--retry-backoff",
                      "1", "--", "echo broken; exit 3", home=home)
    assert result.returncode == 6, result.stderr
    record = status_json("same-1", home)
    assert (record["state"], len(record["attempts"])) == ("REPEATED_FAILURE", 2)  # not 4: retrying won't help
    assert "attempts 1 and 2 failed the same way" in record["reason"]
    assert "retrying would not help" in result.stderr


def test_a_hang_the_policy_stops_is_unhealthy_with_its_stacks_kept(home: Path, kept: dict):
    result = launcher("submit", "--cluster", "healing", "--run-id", "hung-1", *FAST, "--on-hang", "stop", "--",
                      HANGS, home=home)
    assert result.returncode == 7, result.stderr
    assert "attempt 1: hang (rank 0 made no progress for" in result.stderr
    assert "stopping the run (the health policy says stop)" in result.stderr
    record = status_json("hung-1", home)
    assert record["state"] == "UNHEALTHY"
    assert record["reason"].endswith("health.on_hang is stop")
    assert kinds(record).count("health.fault") == 1
    assert "retry.scheduled" not in kinds(record)
    [stacks] = [event for event in record["events"] if event["kind"] == "health.stacks"]
    assert stacks["details"]["taken"] >= 1, stacks
    shown = launcher("diagnose", "hung-1", "--saved", home=home)
    assert shown.returncode == 0, shown.stderr
    assert "1 in <module> (<string>:8)" in shown.stdout  # the driver's frame: line 8 of HANGS, its sleep
    assert "driver" in shown.stdout
    text = launcher("status", "hung-1", home=home).stdout
    assert "health.fault" in text
    assert "health.stacks" in text


def test_a_hang_without_ray_init_has_the_stacks_of_its_entrypoint(home: Path, kept: dict):
    result = launcher("submit", "--cluster", "healing", "--run-id", "plain-1", *FAST, "--on-hang", "stop", "--",
                      PLAIN_HANG, home=home)
    assert result.returncode == 7, result.stderr
    record = status_json("plain-1", home)
    [stacks] = [event for event in record["events"] if event["kind"] == "health.stacks"]
    assert stacks["details"]["taken"] >= 1, stacks
    shown = launcher("diagnose", "plain-1", "--saved", home=home)
    assert shown.returncode == 0, shown.stderr
    assert "1 in <module> (<string>:7)" in shown.stdout  # the script's sleep, line 7 of PLAIN_HANG
    assert "entrypoint -c" in shown.stdout



def test_a_stop_during_a_restarts_backoff_ends_the_run_cleanly(home: Path, kept: dict):
    process = start_launcher("submit", "--cluster", "healing", "--run-id", "stopped-1", *FAST, "--retry-backoff", "120",
                             "--", HANGS, home=home)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    wait_until(lambda: any("stopped (hang); attempt 2 in 120s" in line for line in lines) or process.poll() is not None,
               120, "the restart's backoff")
    stopped = launcher("stop", "stopped-1", home=home)
    assert stopped.returncode == 0, stopped.stderr
    assert process.wait(60) == 3, "".join(lines)
    record = status_json("stopped-1", home)
    assert (record["state"], len(record["attempts"])) == ("STOPPED", 1)
    assert record["attempts"][0]["status"] == "STOPPED"


def test_a_deadline_during_a_restarts_backoff_ends_the_run(home: Path, kept: dict):
    result = launcher("submit", "--cluster", "healing", "--run-id", "late-1", *FAST, "--retry-backoff", "120",
                      "--active-deadline-seconds", "30", "--", HANGS, home=home)
    assert result.returncode == 4, result.stderr
    record = status_json("late-1", home)
    assert (record["state"], len(record["attempts"])) == ("DEADLINE_EXCEEDED", 1)
    assert record["reason"] == "active_deadline_seconds (30s) passed"


def test_the_example_resumes_from_its_last_checkpoint(home: Path, kept: dict):
    result = launcher("submit", "--cluster", "healing", "--run-id", "resume-1", "--working-dir",
                      str(REPO / "examples"), "--max-retries", "1", "--retry-backoff", "1", "--", "python train.py "
                      "--steps 30 --checkpoint-every 10 --fail-at-step 25 --step-seconds 0.05", home=home)
    assert result.returncode == 0, result.stderr
    checkpoints = home / "runs" / "resume-1" / "checkpoints"
    assert f"attempt 2 resumes from step 20 ({checkpoints / 'step-000020.json'})" in result.stdout
    assert "attempt 2 resumes from the checkpoint of step 20" in result.stderr  # what the launcher told it
    assert (checkpoints / "raypulse-checkpoint.json").exists()
    assert "step   30" in result.stdout


def test_ray_train_resumes_itself_after_a_hang(home: Path, kept: dict):
    result = launcher("submit", "--cluster", "healing", "--run-id", "train-v2-1", "--working-dir",
                      str(REPO / "examples"), *FAST, "--hang-after", "10", "--retry-backoff", "1", "--",
                      "python train_ray_train.py --workers 1 --steps 30 --checkpoint-every 10 --step-seconds 0.1 "
                      "--hang-at-step 15", home=home, timeout=280)
    assert result.returncode == 0, result.stderr
    assert "attempt 1: hang (rank 0 made no progress for" in result.stderr
    assert "rank 0: resumed from step 10" in result.stdout  # Ray Train's own resume, same storage and name
    record = status_json("train-v2-1", home)
    assert [attempt["status"] for attempt in record["attempts"]] == ["STOPPED", "SUCCEEDED"]


def test_an_exporter_that_stops_answering_is_reported_never_a_restart(home: Path, kept: dict):
    """Last in the module: it leaves the worker without its exporter."""
    steps = ("python -c 'import time\nfrom exporter import progress\n"
             "for step in range(1, 80):\n    progress.report(step, loss=1.0)\n    time.sleep(0.25)\n"
             "progress.flush()'")
    process = start_launcher("submit", "--cluster", "healing", "--run-id", "blind-1", *FAST, "--", steps, home=home)
    worker_exporter = next(p for p in kept["processes"] if p["role"] == "exporter" and p["node"] != "head")
    wait_until(lambda: state_of("blind-1", home) == "RUNNING", 60, "the job to run")
    os.kill(worker_exporter["pid"], signal.SIGKILL)
    assert process.wait(120) == 0, process.stderr.read()
    record = status_json("blind-1", home)
    assert len(record["attempts"]) == 1
    assert "health.fault" not in kinds(record)
    [event] = [event for event in record["events"] if event["kind"] == "health.exporter_unreachable"]
    assert event["details"]["node"] == "workers-1"
