"""`launcher submit --framework-metrics` on a real local Ray cluster (tests/conftest.py's shared one): a
real TRL GRPOTrainer runs in a Ray actor of the job, with no raypulse code in it, and the run's record
then holds what TRL computed, per step: rewards (and by reward function), KL, completion lengths and
their limit. Ray ran exporter/progress/hooks.py's setup hook in the actor's worker process.
Run under the heavy lock."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.conftest import REPO
from tests.launcher_support import SharedCluster, launcher

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]

RUN = "trl-grpo-1"
JOB = """
import ray
from grpo import train

@ray.remote(num_cpus=1)
class Trainer:  # the user's code: nothing of raypulse
    def run(self):
        return train("model", "out")

ray.init()
print("callbacks attached:", ray.get(Trainer.remote().run.remote()))
"""


def test_a_grpo_run_in_a_ray_actor_is_recorded_as_rl(shared_cluster: SharedCluster, tmp_path: Path):
    shared_cluster.record()
    work = tmp_path / "job"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    shutil.copy(REPO / "tests" / "data" / "trl" / "grpo.py", work / "grpo.py")
    done = launcher("submit", "--cluster", SharedCluster.name, "--run-id", RUN, "--framework-metrics",
                    "--working-dir", str(work), "--record-interval", "1", "--no-health", "--max-retries", "0",
                    "--log-style", "record", "--", "python job.py", home=shared_cluster.home, timeout=360)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "callbacks attached: 1" in done.stdout + done.stderr  # the hook's, in the actor's worker

    exported = launcher("export", RUN, "--out", str(tmp_path / "run.om"), home=shared_cluster.home)
    assert exported.returncode == 0, exported.stderr
    latest: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families((tmp_path / "run.om").read_text()):
        for sample in family.samples:
            if sample.labels.get("run_id") == RUN or sample.labels.get("submission_id", "").startswith(RUN):
                latest[(sample.name, tuple(sorted((k, v) for k, v in sample.labels.items()
                                                  if k in ("source",))))] = sample.value
    assert latest[("raypulse_rl_iteration", ())] == 3
    assert latest[("raypulse_train_step", ())] == 3
    assert latest[("raypulse_rl_response_tokens_limit", ())] == 6
    assert latest[("raypulse_rl_source_reward_mean", (("source", "longer"),))] == pytest.approx(
        latest[("raypulse_rl_reward_mean", ())])
    assert latest[("raypulse_rl_kl", ())] >= 0
