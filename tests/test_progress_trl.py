"""TRL seen as RL with no change to the training code (exporter/progress/trl.py, exporter/progress/hooks.py):
a real GRPOTrainer (TRL 1.16, transformers 5) trains a tiny model made in the test on CPU, in a fresh
interpreter where only the setup hook ran (as Ray runs it in every worker), and a real exporter's
/metrics then holds what TRL computed: steps, rewards by function, KL, completion lengths and their limit."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.progress_support import one, run_hooked
from tests.test_progress_client import exporter_with_progress  # noqa: F401

pytestmark = pytest.mark.slow

# One log of GRPOTrainer.train, as TRL 1.16 wrote it in this test's run (keys of trl/trainer/grpo_trainer.py).
GRPO_LOG = {"loss": -0.19, "grad_norm": 1.21, "learning_rate": 6.7e-07, "num_tokens": 67.0,
            "completions/mean_length": 4.75, "completions/min_length": 3.0, "completions/max_length": 6.0,
            "completions/clipped_ratio": 0.25, "rewards/longer/mean": 0.575, "rewards/longer/std": 0.457,
            "reward": 0.575, "reward_std": 0.457, "frac_reward_zero_std": 0.0, "kl": 0.0, "entropy": 3.36,
            "step_time": 0.067, "epoch": 0.125}


def test_a_grpo_log_becomes_an_rl_iteration():
    from exporter.progress.trl import iteration_fields

    assert iteration_fields(GRPO_LOG, 6.0) == {
        "reward_mean": 0.575, "reward_std": 0.457, "rewards": {"longer": 0.575}, "kl": 0.0, "entropy": 3.36,
        "response_length_mean": 4.75, "response_length_max": 6.0, "response_length_limit": 6.0,
        "truncated_ratio": 0.25}
    assert iteration_fields({"reward": float("nan"), "kl": "x"}, None)["reward_mean"] is None  # left out, no error


GRPO = REPO / "tests" / "data" / "trl"  # grpo.py: a real GRPOTrainer on a tiny model, three steps

GRPO_RUN = """
    import json, sys
    from exporter.progress import hooks
    hooks.setup()  # what Ray runs first in every worker of a job submitted with --framework-metrics
    assert "transformers" not in sys.modules  # nothing imported until the code imports it

    sys.path.insert(0, sys.argv[1])
    from grpo import train
    from exporter import progress
    attached = train(sys.argv[2], sys.argv[3])
    assert progress.flush(10)
    print(json.dumps({**progress.stats(), "attached": attached}))
"""


def test_a_grpo_run_where_only_the_setup_hook_ran_is_reported_as_rl(exporter_with_progress, tmp_path):  # noqa: F811
    exporter, stats = run_hooked(exporter_with_progress, tmp_path, GRPO_RUN, "grpo-1", str(GRPO),
                                 str(tmp_path / "model"), str(tmp_path / "out"), last_step=3)
    assert stats["attached"] == 1
    assert stats["dropped"] == stats["rejected"] == 0
    assert stats["sent"] == 6  # three steps, each a training step and an RL iteration

    def at(family: str, **labels: str) -> float:
        return one(exporter, family, "grpo-1", **labels)

    assert at("raypulse_train_step") == 3
    assert at("raypulse_rl_iteration") == 3
    assert at("raypulse_rl_response_tokens_limit") == 6  # GRPOConfig.max_completion_length
    assert 0 <= at("raypulse_rl_response_tokens_max") <= 6
    assert 0 <= at("raypulse_rl_truncated_ratio") <= 1
    reward = at("raypulse_rl_reward_mean")
    assert at("raypulse_rl_source_reward_mean", source="longer") == pytest.approx(reward)  # one reward function
    assert at("raypulse_rl_kl") >= 0


def test_framework_metrics_names_the_setup_hook_in_every_attempts_runtime_env():
    import importlib

    from exporter.contract import wire
    from exporter.progress import hooks
    from launcher.backends.kuberay.render import render
    from launcher.run import runtime_env
    from launcher.spec import build_spec

    spec = build_spec({"entrypoint": "python grpo.py", "framework_metrics": True}).with_run_id()
    assert runtime_env(spec, attempt=1)["worker_process_setup_hook"] == wire.FRAMEWORK_SETUP_HOOK
    module, _, name = wire.FRAMEWORK_SETUP_HOOK.rpartition(".")
    assert getattr(importlib.import_module(module), name) is hooks.setup  # what Ray will import in each worker
    assert "worker_process_setup_hook" not in runtime_env(build_spec({"entrypoint": "python grpo.py"}), attempt=1)
    kube = build_spec({"entrypoint": "python grpo.py", "framework_metrics": True, "backend": "kuberay"}).with_run_id()
    assert wire.FRAMEWORK_SETUP_HOOK in str(render(kube))
