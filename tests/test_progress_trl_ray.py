"""`launcher submit --framework-metrics` on a real local Ray cluster (tests/conftest.py's shared one): a
real TRL GRPOTrainer runs in a Ray actor of the job, with no raypulse code in it, and the node's exporter
then serves what TRL computed: steps, rewards (and by reward function), KL, completion lengths and their
limit. Ray ran exporter/progress/hooks.py's setup hook in the actor's worker process.
Run under the heavy lock."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, http_get, wait_until
from tests.launcher_support import SharedCluster, launcher

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]

RUN = "trl-grpo-1"
JOB = """
import sys

import ray
from grpo import train

@ray.remote(num_cpus=1)
class Trainer:  # the user's code: nothing of raypulse
    def run(self):
        return train("model", "out")

ray.init()
attached = ray.get(Trainer.remote().run.remote())
print("callbacks attached:", attached)
# The verdict is the exit status, not the line: in one CI run the log lacked it and the actor's last lines.
# The driver prints this as Ray's thread prints the actor's output to the same sys.stdout, and CPython 3.11's
# TextIOWrapper can drop text written from two threads at once (python/cpython#118138, #119506).
sys.exit(0 if attached == 1 else 3)
"""


def test_a_grpo_run_in_a_ray_actor_is_reported_as_rl(shared_cluster: SharedCluster, tmp_path: Path):
    record = shared_cluster.record()
    work = tmp_path / "job"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    shutil.copy(REPO / "tests" / "data" / "trl" / "grpo.py", work / "grpo.py")
    done = launcher("submit", "--cluster", SharedCluster.name, "--run-id", RUN, "--framework-metrics",
                    "--working-dir", str(work), "--no-health", "--max-retries", "0",
                    "--log-style", "record", "--", "python job.py", home=shared_cluster.home, timeout=360)
    # 0: the hook's RaypulseCallback, and only it, was attached in the actor's worker (the job's own check)
    assert done.returncode == 0, done.stdout + done.stderr

    # The worker's exporter keeps a finished job's progress (progress.finished_grace_seconds): what TRL
    # computed is there once its train collector ran after the last report.
    urls = [exporter["url"] for exporter in record["exporters"]]

    def latest() -> dict[tuple[str, tuple], float]:
        found = {}
        for url in urls:
            for family in text_string_to_metric_families(http_get(url + "/metrics")[2].decode()):
                for sample in family.samples:
                    if sample.labels.get("submission_id", "").startswith(RUN):
                        found[(sample.name, tuple(sorted((k, v) for k, v in sample.labels.items()
                                                         if k == "source")))] = sample.value
        return found

    wait_until(lambda: latest().get(("raypulse_rl_iteration", ())) == 3, 30, "the third GRPO step on /metrics")
    values = latest()
    assert values[("raypulse_train_step", ())] == 3
    assert values[("raypulse_rl_response_tokens_limit", ())] == 6
    assert values[("raypulse_rl_source_reward_mean", (("source", "longer"),))] == pytest.approx(
        values[("raypulse_rl_reward_mean", ())])
    assert values[("raypulse_rl_kl", ())] >= 0
