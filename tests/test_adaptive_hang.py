"""The hang threshold learned from the run, end to end (issue 38: "a job whose steps take 0.2 s: a hang
is judged within 2 minutes with default settings"): a real kept local cluster (the suite's shared one),
a job that reports a step every 0.2 s and then hangs, `launcher submit` with the health policy's
defaults (no threshold given; `--max-retries 0` only so that the hang ends the run instead of restarting
it). The journal says which threshold it learned, and the hang is judged by it, not by the alert rule's
15 minutes.

Run under `flock /tmp/raypulse-ray.lock`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.health.policy import HANG_AFTER_SECONDS
from launcher.health.threshold import FLOOR_S
from tests.launcher_support import SharedCluster, launcher, status_json

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

# Steps of 0.2 s until the launcher has learned its threshold from them (its run record, in the launcher's home,
# which the shared cluster's processes inherit, says so), then it hangs with its driver alive (a stuck
# collective, say). The threshold is learned at the 20th check of the default 10 s that saw it advance: about
# 215 s after the job started (the first check comes at about 14 s). At 250 s it hangs all the same, so that
# a threshold never learned fails the test below rather than its timeout.
RUN = "adaptive-fast-1"
FAST_THEN_HANGS = """python -c '
import os, time
from exporter import progress
from exporter.contract import wire
from launcher.state import load_run

def learned() -> bool:
    run = load_run(os.environ[wire.ENV_RUN_ID])  # written atomically; None until the launcher saved it
    return run is not None and any(e.kind == "health.threshold" and e.details["rule"] == "steps" for e in run.events)

began = time.time()
step = 0
while time.time() - began < 250 and not (step % 5 == 0 and learned()):
    step += 1
    progress.report(step, loss=1.0)
    time.sleep(0.2)
progress.flush()
time.sleep(3600)
'"""
# Submitted when the shared cluster starts; the other tests on it run during its five minutes, this one last.
HEAD_START = {RUN: ("--max-retries", "0", "--", FAST_THEN_HANGS)}


def test_a_job_of_fast_steps_is_judged_hung_within_two_minutes_with_the_default_policy(
        shared_launcher_home: Path, shared_cluster: SharedCluster):
    home = shared_launcher_home  # where the shared cluster is known; the run ends with its job stopped
    result = shared_cluster.finish(RUN, timeout=800)
    assert result.returncode == 7, result.stderr  # UNHEALTHY: a fault with no retries left
    record = status_json(RUN, home)
    events = record["events"]
    learned = [event["details"] for event in events if event["kind"] == "health.threshold"]
    assert learned[0]["rule"] == "fixed"
    assert learned[0]["seconds"] == HANG_AFTER_SECONDS  # before 20 intervals were seen
    assert (learned[-1]["rule"], learned[-1]["seconds"]) == ("steps", FLOOR_S)  # 10 x p99 of 0.2 s, the floor
    [fault] = [event["details"] for event in events if event["kind"] == "health.fault"]
    assert fault["fault"] == "hang"
    assert (fault["evidence"]["threshold_rule"], fault["evidence"]["threshold"]) == ("steps", FLOOR_S)
    assert fault["evidence"]["quiet_seconds"] <= 120  # the bound, judged by the watcher's own clock
    text = launcher("status", RUN, home=home).stdout
    assert f"hang      after {FLOOR_S:g}s without progress (10 x p99 report interval" in text
