"""The launcher process itself dies (SIGKILL) while it supervises a healed run on a kept local cluster:
during the backoff between two attempts, and during an attempt. `launcher submit --run-id RUN ...` again
takes the run over from where it is: the retry the dead launcher decided goes ahead (not attempt 1
again, not a second job beside the first), a running attempt is followed and watched (its hang is
healed), the journal keeps every event written before the kill and gets one end. While the first
launcher lives, a second submit of its run is refused.

Ray's Jobs API is read all along by the test itself: at no moment do two jobs of the run run at once,
and the run's jobs are exactly its attempts, one each. Run under `flock /tmp/raypulse-heavy.lock`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from exporter.contract import wire
from launcher.display import PlainReporter
from launcher.healing import Healing
from launcher.health.exporters import Target
from launcher.health.policy import FaultClass, HealthPolicy
from launcher.journal import Journal
from launcher.state import RunRecord
from tests.broken_exporters import ExporterLike
from tests.conftest import http_get, wait_until
from tests.launcher_support import SharedCluster, launcher, start_launcher, status_json
from tests.test_healing_recovery import RUN, Exporter


def on_ray(test):
    """The tests that start a cluster: the ray and slow lanes."""
    return pytest.mark.ray(pytest.mark.slow(pytest.mark.timeout(420)(test)))


CLUSTER = SharedCluster.name  # tests/conftest.py's shared_cluster
# Attempt 1 reports five steps, then hangs (its driver stays alive, and says so in its log); attempt 2
# reports ten and succeeds.
JOB = ("python -c 'import os, time\nfrom exporter import progress\n"
       "hang = os.environ[\"RAYPULSE_ATTEMPT\"] == \"1\"\n"
       "for step in range(1, 11):\n    progress.report(step, loss=1.0)\n    time.sleep(0.3)\n"
       "    if hang and step == 5:\n        progress.flush()\n        print(\"hangs at step 5\", flush=True)\n"
       "        time.sleep(3600)\n"
       "progress.flush()'")
HEALED = ["--health-check-interval", "1", "--hang-after", "15", "--max-retries", "1"]
# The backoff a launcher is killed during: long enough for the test to act in it (a second submit, a kill).
BACKOFF_S = 20
# The backoff of a run whose launcher is killed during an attempt: the one who takes over waits it; nothing
# happens in it but the stop of attempt 1, which the launcher waits for before it submits attempt 2.
SHORT_BACKOFF_S = 2
NOT_ENDED = ("PENDING", "RUNNING")


@pytest.fixture(scope="module")
def home(shared_launcher_home: Path) -> Path:
    return shared_launcher_home  # where the shared cluster is known


@pytest.fixture(scope="module")
def kept(shared_cluster: SharedCluster) -> dict:
    return shared_cluster.record()


class JobsSeen:
    """Polls the cluster's Jobs API on a thread: the most jobs of one run that were PENDING or RUNNING
    at the same time, and every submission id of the run seen."""

    def __init__(self, cluster: dict, run_id: str) -> None:
        self.url = cluster["address"].rstrip("/") + "/api/jobs/"
        self.auth = {"Authorization": f"Bearer {Path(cluster['token_path']).read_text().strip()}"}
        self.run_id = run_id
        self.most_at_once = 0
        self.submission_ids: list[str] = []  # as listed, one entry per job
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def jobs(self) -> list[dict]:
        status, _, body = http_get(self.url, headers=self.auth, timeout=10)
        assert status == 200, body[:200]
        return [job for job in json.loads(body) if (job.get("metadata") or {}).get(wire.META_RUN_ID) == self.run_id]

    def log(self, submission_id: str) -> str:
        """The attempt's driver log so far ("" while the dashboard does not answer)."""
        try:
            status, _, body = http_get(f"{self.url}{submission_id}/logs", headers=self.auth, timeout=10)
            return (json.loads(body).get("logs") or "") if status == 200 else ""
        except (OSError, ValueError):
            return ""

    def _poll(self) -> None:
        while not self._done.wait(0.2):
            try:
                jobs = self.jobs()
            except (OSError, AssertionError, ValueError):
                continue  # the dashboard busy for a moment: the next poll counts
            self.most_at_once = max(self.most_at_once, sum(job["status"] in NOT_ENDED for job in jobs))
            self.submission_ids = [job["submission_id"] for job in jobs]

    def stop(self) -> None:
        self._done.set()
        self._thread.join(15)
        self.submission_ids = [job["submission_id"] for job in self.jobs()]


def supervise(run_id: str, home: Path, backoff: int) -> tuple[subprocess.Popen, list[str]]:
    """`launcher submit` of the run, with its stderr lines collected as they come."""
    process = start_launcher("submit", "--cluster", CLUSTER, "--run-id", run_id, *HEALED, "--retry-backoff",
                             str(backoff), "--", JOB, home=home)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
    return process, lines


def events_of(run_id: str, home: Path) -> list[tuple[float, str]]:
    record = json.loads((home / "runs" / run_id / "run.json").read_text())
    return [(event["time"], event["kind"]) for event in record["events"]]


def kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    assert process.wait(30) == -signal.SIGKILL


def taken_over(run_id: str, home: Path, before: list[tuple[float, str]], jobs: JobsSeen, backoff: int) -> dict:
    """Submit the run again after its launcher was killed; it must end SUCCEEDED with attempt 2, its
    journal continuing the one before the kill."""
    result = launcher("submit", "--cluster", CLUSTER, "--run-id", run_id, *HEALED, "--retry-backoff", str(backoff),
                      "--", JOB, home=home)
    jobs.stop()
    assert result.returncode == 0, result.stderr
    record = status_json(run_id, home)
    assert (record["state"], record["exit_code"]) == ("SUCCEEDED", 0)
    assert [(a["attempt"], a["status"]) for a in record["attempts"]] == [(1, "STOPPED"), (2, "SUCCEEDED")]
    after = events_of(run_id, home)
    assert after[:len(before)] == before  # nothing written before the kill is lost
    assert [kind for _, kind in after].count("run.finished") == 1
    assert "attempt.found" in [kind for _, kind in after[len(before):]]  # the run was followed, not restarted
    assert jobs.most_at_once == 1, jobs.most_at_once  # never two jobs of the run at once
    assert sorted(jobs.submission_ids) == [f"{run_id}-a1", f"{run_id}-a2"]  # one job per attempt
    return record


@on_ray
def test_a_launcher_killed_during_the_backoff_is_taken_over_by_a_new_submit(home: Path, kept: dict):
    jobs = JobsSeen(kept, "backoff-1")
    first, lines = supervise("backoff-1", home, BACKOFF_S)
    try:
        wait_until(lambda: any(f"attempt 2 in {BACKOFF_S}s" in line for line in lines) or first.poll() is not None, 180,
                   "the restart's backoff")
        assert first.poll() is None, "".join(lines)
        # A second supervisor beside a live one is refused, and changes nothing.
        second = launcher("submit", "--cluster", CLUSTER, "--run-id", "backoff-1", *HEALED, "--", JOB, home=home)
        assert second.returncode == 2, second.stderr
        assert "run backoff-1 is supervised by a launcher that is still running" in second.stderr
        kill(first)
    finally:
        first.kill()
    before = events_of("backoff-1", home)
    assert "retry.scheduled" in [kind for _, kind in before]
    record = taken_over("backoff-1", home, before, jobs, BACKOFF_S)
    assert [event["kind"] for event in record["events"]].count("health.fault") == 1


@on_ray
def test_a_launcher_killed_during_an_attempt_is_taken_over_and_its_hang_healed(home: Path, kept: dict):
    jobs = JobsSeen(kept, "during-1")
    first, lines = supervise("during-1", home, SHORT_BACKOFF_S)
    try:
        # Killed once the attempt hangs: its steps were all reported to the launcher that died, none to the
        # one that takes over (which must still count them as the attempt's, and see the hang).
        wait_until(lambda: "hangs at step 5" in jobs.log("during-1-a1") or first.poll() is not None, 180,
                   "attempt 1 to hang", interval=0.5)
        assert first.poll() is None, "".join(lines)
        kill(first)
    finally:
        first.kill()
    before = events_of("during-1", home)
    assert "health.fault" not in [kind for _, kind in before]  # killed before its launcher saw the hang
    record = taken_over("during-1", home, before, jobs, SHORT_BACKOFF_S)
    faults = [event for event in record["events"] if event["kind"] == "health.fault"]
    assert [(event["attempt"], event["details"]["fault"]) for event in faults] == [(1, "hang")]


def test_a_taken_over_attempt_counts_the_steps_it_made_before_the_take_over(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    """The watcher of the launcher that takes a running attempt over starts after the attempt's steps:
    they are still the attempt's (a hang that began before the take-over is seen, at the hang threshold,
    not at the much longer silence threshold of a job that never reported a step)."""
    monkeypatch.setenv(wire.ENV_HOME, str(tmp_path))
    record = RunRecord(run_id=RUN, name="r", backend="local", max_attempts=2)
    with ExporterLike() as server:
        exporter = Exporter(server)
        Journal(PlainReporter(), record).emit("attempt.submitted", attempt=1, submission_id=f"{RUN}-a1",
                                              address="http://h", entrypoint="python train.py")
        exporter.steps(1, range(1, 6))  # then it hangs at step 5, and its launcher is killed
        policy = HealthPolicy(check_interval_seconds=0.5, hang_after_seconds=1.5, stacks=False)
        heal = Healing(policy, Journal(PlainReporter(), record), lambda: [Target("head", server.url)])
        heal.watch(1, f"{RUN}-a1")  # what Run.start does for an attempt it finds running
        heal.running(time.time())
        fault = None
        deadline = time.monotonic() + 15
        while fault is None and time.monotonic() < deadline:
            wait_until(heal.watcher.due, 5, "the next check")
            fault = heal.check()
    assert fault is not None
    assert (fault.kind, fault.last_step) == (FaultClass.HANG, 5)
