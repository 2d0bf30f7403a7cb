"""examples/rl_post_training.py, the LLM-shaped RL loop, on a real Ray instance reporting to a real
exporter: its phases, reward sources, weight syncs and iterations as raypulse_rl_* series, and a reward
that climbs (the run is seeded: the same trajectory every time). RLlib's PPO runs in tests/test_rl_drill.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.contract import wire
from tests.conftest import REPO, RunningExporter, wait_until
from tests.ray_testcluster import stop_process
from tests.test_progress_client import job_config
from tests.test_progress_endpoint import start_progress_exporter

SUBMISSION = "rl-example-a1"


def samples(exporter: RunningExporter, family: str) -> list:
    return [s for f in text_string_to_metric_families(exporter.metrics_text()) for s in f.samples
            if s.name == family and s.labels.get("submission_id") == SUBMISSION]


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_the_llm_shaped_example_reports_its_phases_sources_and_a_climbing_reward(tmp_path):
    home_token = Path.home() / ".ray" / "auth_token"
    had_token = home_token.exists()
    exporter = start_progress_exporter(tmp_path)
    try:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY", "RAYPULSE"))}
        # HOME too: a plain ray.init() writes ~/.ray/auth_token, which every later exporter would read.
        env |= {wire.ENV_PROGRESS_URL: f"http://127.0.0.1:{exporter.progress_port}", "HOME": str(tmp_path),
                "RAY_JOB_CONFIG_JSON_ENV_VAR": job_config(SUBMISSION)}
        run = subprocess.run([sys.executable, "examples/rl_post_training.py", "--iterations", "12",
                              "--decode-step-seconds", "0", "--train-seconds", "0"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stderr[-3000:]
        rewards = [float(r) for r in re.findall(r"^iteration +\d+ +reward ([0-9.]+)", run.stdout, re.MULTILINE)]
        assert len(rewards) == 12
        assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards  # it learns

        wait_until(lambda: [s.value for s in samples(exporter, "raypulse_rl_iteration")] == [11.0], 30,
                   "the last iteration on /metrics")
        assert {s.labels["phase"] for s in samples(exporter, "raypulse_rl_phase_seconds_total")} == \
            {"generate", "score", "reference", "train", "weight_sync"}
        assert {s.labels["source"] for s in samples(exporter, "raypulse_rl_source_reward_mean")} == \
            {"correctness", "format"}
        [reward] = samples(exporter, "raypulse_rl_reward_mean")
        assert reward.value == pytest.approx(rewards[-1], abs=1e-3)
        [synced] = samples(exporter, "raypulse_rl_weight_sync_bytes")
        assert synced.value > 0
        [sync_seconds] = samples(exporter, "raypulse_rl_weight_sync_seconds")
        assert sync_seconds.value > 0  # the weight_sync phase's time, as the client derives it
        [rollouts] = samples(exporter, "raypulse_rl_rollouts_total")
        assert rollouts.value == 12 * 9 * 8  # 9 prompts, a group of 8 responses each, every iteration
        [truncated] = samples(exporter, "raypulse_rl_truncated_ratio")
        assert 0 <= truncated.value <= 1
        assert home_token.exists() == had_token  # the run left this user's Ray token alone
    finally:
        stop_process(exporter.process)
