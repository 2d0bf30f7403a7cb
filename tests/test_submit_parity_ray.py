"""`launcher submit --submission-id X --entrypoint-num-gpus 1 --metadata-json '{"a": "b"}'` on a real
local Ray cluster (tests/conftest.py's shared one: a worker with one simulated GPU): Ray's Jobs API and
State API report each as asked, and submitting X again follows that run instead of starting a second job.
Run under the heavy lock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.raydash import RayDashboard
from launcher.submission import run_id_of
from tests.launcher_support import SharedCluster, launcher, status_json

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SUBMISSION_ID = "raysubmit_Parity.1"


def test_ray_job_submit_flags_reach_ray(shared_cluster: SharedCluster):
    record = shared_cluster.record()  # tests/conftest.py's: its worker has one simulated GPU
    home = shared_cluster.home
    args = ("submit", "--cluster", SharedCluster.name, "--submission-id", SUBMISSION_ID, "--entrypoint-num-gpus", "1",
            "--entrypoint-num-cpus", "0.5", "--metadata-json", '{"a": "b"}', "--no-health", "--max-retries",
            "0", "--log-style", "record", "--", "echo parity-ran")
    first = launcher(*args, home=home)
    assert first.returncode == 0, first.stderr

    from ray.job_submission import JobSubmissionClient

    token = Path(record["token_path"]).read_text().strip()
    client = JobSubmissionClient(record["address"], headers={"Authorization": f"Bearer {token}"})
    info = client.get_job_info(SUBMISSION_ID)
    assert info.submission_id == SUBMISSION_ID
    assert info.metadata["a"] == "b"
    assert info.metadata["raypulse.run_id"] == run_id_of(SUBMISSION_ID)
    assert info.status.value == "SUCCEEDED"
    # Ray's JobDetails leaves the entrypoint's resources out: the job's supervisor actor, which runs
    # the entrypoint, was scheduled with them (so on the worker, the one node with a GPU).
    dashboard = RayDashboard(record["address"], token)
    supervisors = dashboard.state_list("actors", [("class_name", "=", "JobSupervisor")])
    ours = [actor for actor in supervisors if actor.get("ray_namespace") == "SUPERVISOR_ACTOR_RAY_NAMESPACE"
            and SUBMISSION_ID in (actor.get("name") or "")]
    assert [actor["required_resources"] for actor in ours] == [{"GPU": 1.0, "CPU": 0.5}], supervisors

    # The same submission id again: the run is followed, not repeated (-o json: the run, on stdout).
    again = launcher(*args[:1], "-o", "json", *args[1:], home=home)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["run_id"] == run_id_of(SUBMISSION_ID)
    ours = [job.submission_id for job in client.list_jobs() if (job.submission_id or "").startswith("raysubmit_P")]
    assert ours == [SUBMISSION_ID]
    run = status_json(run_id_of(SUBMISSION_ID), home)
    assert [attempt["submission_id"] for attempt in run["attempts"]] == [SUBMISSION_ID]
