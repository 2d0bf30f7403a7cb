"""verl seen as RL with no change to its code (exporter/progress/verl.py, exporter/progress/hooks.py): in a
fresh interpreter where only the setup hook ran (as Ray runs it in verl's TaskRunner actor), verl 0.9.1's
own metric functions (`compute_data_metrics`, `compute_timing_metrics`, `compute_throughout_metrics` on a
small batch built with verl's DataProto) and its own `Tracking` logger log three steps, and a real
exporter's /metrics then holds the values verl computed."""

from __future__ import annotations

import pytest

from exporter.contract import wire
from tests.progress_support import one, run_hooked
from tests.test_progress_client import exporter_with_progress, series  # noqa: F401

pytestmark = pytest.mark.slow

VERL_RUN = """
    import json, sys
    from exporter.progress import hooks
    hooks.setup()  # what Ray runs first in every worker of a job submitted with --framework-metrics
    assert "verl" not in sys.modules

    import torch
    from verl import DataProto
    from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
    from verl.utils.tracking import Tracking
    from exporter import progress

    torch.manual_seed(7)
    prompt, response = 3, 5
    attention = torch.ones(4, prompt + response, dtype=torch.long)
    attention[0, -2:] = 0  # two responses end early, one at the limit
    attention[1, -4:] = 0
    scores = torch.zeros(4, response)
    scores[:, 0] = torch.tensor([1.0, 0.0, 0.5, 0.25])  # a sequence's score sits on one token
    batch = DataProto.from_dict(
        tensors={"prompts": torch.ones(4, prompt, dtype=torch.long),
                 "responses": torch.ones(4, response, dtype=torch.long),
                 "attention_mask": attention, "response_mask": attention[:, prompt:], "token_level_scores": scores,
                 "token_level_rewards": scores - 0.01, "advantages": torch.randn(4, response),
                 "returns": torch.randn(4, response)},
        meta_info={"global_token_num": [int(n) for n in attention.sum(-1)]})
    tracking = Tracking(project_name="p", experiment_name="e", default_backend="console")
    logged = []
    for step in (1, 2, 3):
        timing = {"gen": 0.5 * step, "reward": 0.1, "old_log_prob": 0.2, "ref": 0.2, "adv": 0.01,
                  "update_actor": 0.3, "update_weights": 0.05, "step": 1.4 + 0.5 * step}
        metrics = {**compute_data_metrics(batch, use_critic=False), **compute_timing_metrics(batch, timing),
                   **compute_throughout_metrics(batch, timing, n_gpus=1),
                   # what the actor's update returns (verl/workers: pg_loss, entropy, kl_loss with use_kl_loss)
                   "actor/pg_loss": 0.1 * step, "actor/entropy": 1.5, "actor/kl_loss": 0.02, "actor/grad_norm": 0.7,
                   "actor/lr": 1e-6}
        tracking.log(data=metrics, step=step)
        logged.append({k: float(v) for k, v in metrics.items()})
    tracking.log(data={"val-core/gsm8k/reward/mean@1": 0.4}, step=3)  # validation: not a training step
    assert progress.flush(10)
    print(json.dumps({**progress.stats(), "logged": logged}))
"""


def test_verls_logged_steps_are_reported_as_rl_where_only_the_setup_hook_ran(exporter_with_progress, tmp_path):  # noqa: F811
    exporter, stats = run_hooked(exporter_with_progress, tmp_path, VERL_RUN, "verl-1", last_step=3)
    assert stats["dropped"] == stats["rejected"] == 0
    assert stats["sent"] == 6  # three steps, each a training step and an RL iteration; validation left out
    last = stats["logged"][-1]

    def at(family: str, **labels: str) -> float:
        return one(exporter, family, "verl-1", **labels)

    assert at("raypulse_train_step") == 3
    assert at("raypulse_train_loss") == pytest.approx(0.3)
    assert at("raypulse_rl_iteration") == 3
    assert at("raypulse_rl_reward_mean") == pytest.approx(last["critic/score/mean"])
    assert at("raypulse_rl_kl") == pytest.approx(0.02)
    assert at("raypulse_rl_entropy") == pytest.approx(1.5)
    assert at("raypulse_rl_response_tokens_mean") == pytest.approx(last["response_length/mean"])
    assert at("raypulse_rl_response_tokens_max") == pytest.approx(last["response_length/max"])
    assert at("raypulse_rl_truncated_ratio") == pytest.approx(last["response_length/clip_ratio"])
    # verl's timers are the phases, summed over the three steps; update_weights is the weight sync.
    assert at("raypulse_rl_phase_seconds_total", phase="gen") == pytest.approx(0.5 + 1.0 + 1.5)
    assert at("raypulse_rl_phase_seconds_total", phase=wire.RL_WEIGHT_SYNC_PHASE) == pytest.approx(0.15)
    assert not [k for k in series(exporter, "raypulse_rl_phase_seconds_total") if dict(k).get("phase") == "step"]
