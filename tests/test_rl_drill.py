"""RL post-training on real RLlib, end to end: the RL drill's quick subset (`make rl-drill` runs every
fault). PPO with raypulse's RLlib callback through the launcher on a local Ray cluster, a real
Prometheus, Alertmanager and webhook receiver with the `rl` rules: the healthy run raises nothing, every
query of the RL board returns data, and each fault's alert arrives, with the labels that locate it,
within its budget. Plus the callback's mapping of RLlib's results, without Ray.

Starts Ray: run under `flock /tmp/raypulse-ray.lock` (about 2-3 minutes once it holds the lock).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from alerts import build
from scripts.drill.faults import Fault
from scripts.rl_drill.faults import QUICK, Context, catalog
from scripts.rl_drill.report import render
from scripts.rl_drill.run import budget, drill_config, run
from tests.conftest import REPO


def _context() -> Context:
    config = drill_config()
    return Context(cluster="c", submission_id="run-a1", job_control=Path("j"),
                   stall_age=config.tune("RaypulseRLPhaseStalled").age.seconds,
                   sync_delay=config.tune("RaypulseRLWeightSyncSlow").duration.seconds + 3,
                   collapse_window=config.tune("RaypulseRLRewardCollapsed").window.seconds)


def test_the_catalog_drills_every_rl_alert_in_seconds():
    rl_alerts = {alert.name for group, alert in build.all_alerts() if group.name == "rl"}
    faults: list[Fault] = catalog(_context())
    assert {e.alertname for fault in faults for e in fault.expect} == rl_alerts
    assert set(QUICK) < {fault.key for fault in faults}
    for fault in faults:
        for expect in fault.expect:
            assert budget(expect, fault) < 60, f"{fault.key}: {expect} would take minutes at the drill's scale"


def test_rllib_results_become_rl_iterations():
    from exporter.contract import wire
    from exporter.progress.rllib import LENGTH_LIMIT, RETURN, RETURN_SQUARED, TRUNCATED, iteration_fields, phase_name

    result = {"env_runners": {"num_episodes": 12, "num_env_steps_sampled": 400, "episode_return_mean": 30.0,
                              RETURN: 33.0, RETURN_SQUARED: 33.0**2 + 4.0**2, "episode_len_mean": 33.0,
                              "episode_len_max": 80, LENGTH_LIMIT: 500.0, TRUNCATED: 0.25,
                              "module_episode_return_mean": {"default_policy": 33.0}},
              "learners": {"default_policy": {"mean_kl_loss": 0.02, "entropy": 0.6},
                           "other": {"mean_kl_loss": 0.04, "entropy": math.nan},
                           "__all_modules__": {"mean_kl_loss": 9.0}}}
    fields = iteration_fields(result)
    assert fields == {"rollouts": 12, "generated_tokens": 400, "reward_mean": 33.0,
                      "reward_std": pytest.approx(4.0), "rewards": {"default_policy": 33.0},
                      "kl": pytest.approx(0.03), "entropy": 0.6, "response_length_mean": 33.0,
                      "response_length_max": 80, "response_length_limit": 500.0, "truncated_ratio": 0.25}
    assert iteration_fields({})["reward_mean"] is None  # nothing to read: fields left out, no error
    assert [phase_name(t) for t in ("env_runner_sampling_timer", "learner_update_timer", "synch_weights",
                                    "synch_env_connectors")] == ["sample", "learn", wire.RL_WEIGHT_SYNC_PHASE,
                                                                 "synch_env_connectors"]


def test_the_episode_limit_is_read_through_the_wrappers():
    import gymnasium as gym

    from exporter.progress.rllib import _length_limit

    class Runner:
        env = gym.make_vec("CartPole-v1", num_envs=1, vectorization_mode="sync")

    assert _length_limit(Runner()) == 500
    Runner.env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=77)])
    assert _length_limit(Runner()) == 77


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_rl_drill_raises_each_rl_alert_in_time_on_real_rllib(tmp_path):
    report = run(quick=True, healthy_seconds=20, workdir=tmp_path, log=print)
    artifacts = REPO / "tests" / "artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "rl-drill.md").write_text(render(report))
    assert report.panels > 0
    assert not report.empty_panels, report.empty_panels
    for family in ("raypulse_rl_iteration", "raypulse_rl_reward_mean", "raypulse_rl_phase_seconds_total",
                   "raypulse_rl_kl", "raypulse_rl_truncated_ratio", "raypulse_rl_weight_sync_bytes"):
        assert report.series.get(family, 0) >= 1, (family, report.series)
    assert report.series["raypulse_rl_phase_seconds_total"] >= 3  # sample, learn, weight_sync at least
    assert not report.healthy_alerts, report.healthy_alerts
    late = [o for o in report.outcomes if not o.ok]
    assert not late, json.dumps([o.__dict__ for o in late], indent=1)
    assert {o.fault for o in report.outcomes} == set(QUICK)
    for outcome in report.outcomes:
        assert {k: outcome.received.get(k) for k in outcome.expected_labels} == outcome.expected_labels
    assert not report.false_alarms, report.false_alarms
