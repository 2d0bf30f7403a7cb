"""OpenRLHF seen as RL with no change to its code (exporter/progress/openrlhf.py, exporter/progress/hooks.py).

OpenRLHF 0.11.0 cannot be installed beside raypulse (it pins ray[default]==2.55.0, transformers==5.15.0
and flash-attn==2.8.3, a CUDA build), and its trainer module does not import without DeepSpeed. What is
tested instead: the keys its PPO trainer logs, read from its source (openrlhf/trainer/ppo_trainer.py,
`train_step`, `_compute_rollout_stats`, `fit`, commit 3c3be62), and the hook's patch on a module of
the same name whose `BasePPOTrainer.save_logs_and_checkpoints` has OpenRLHF's signature, imported after
the hook ran, reporting to a real exporter. No OpenRLHF code runs here."""

from __future__ import annotations

import pytest

from exporter.contract import wire
from tests.progress_support import one, run_hooked
from tests.test_progress_client import exporter_with_progress  # noqa: F401

pytestmark = pytest.mark.slow

# One step's status as OpenRLHF 0.11.0's PPOTrainer.fit hands it to save_logs_and_checkpoints.
STATUS = {"policy_loss": 0.12, "actor_lr": 5e-7, "kl": 0.004, "ppo_clip_ratio": 0.01, "entropy_loss": 1.1,
          "critic_loss": 0.3, "timing/make_experience": 2.0, "timing/ppo_train": 3.0, "timing/broadcast": 0.5,
          "rollout/reward_mean": 0.42, "rollout/reward_std": 0.2, "rollout/response_length_mean": 310.0,
          "rollout/truncated_rate": 0.05, "rollout/num_samples": 64.0, "timing/generation": 6.0,
          "timing/step_total": 11.5}


def test_a_ppo_step_status_becomes_an_rl_iteration():
    from exporter.progress.openrlhf import iteration_fields

    assert iteration_fields(STATUS) == {
        "phases": {"generate": 6.0, "make_experience": 2.0, "train": 3.0, wire.RL_WEIGHT_SYNC_PHASE: 0.5},
        "rollouts": 64, "reward_mean": 0.42, "reward_std": 0.2, "kl": 0.004, "response_length_mean": 310.0,
        "truncated_ratio": 0.05}


OPENRLHF_RUN = """
    import json, pathlib, sys
    from exporter.progress import hooks
    hooks.setup()

    # A package named as OpenRLHF's, whose method has the signature of openrlhf/trainer/ppo_trainer.py's
    # BasePPOTrainer.save_logs_and_checkpoints (0.11.0); the hook patches it when it is imported.
    root = pathlib.Path(sys.argv[1])
    (root / "openrlhf" / "trainer").mkdir(parents=True)
    (root / "openrlhf" / "__init__.py").write_text("")
    (root / "openrlhf" / "trainer" / "__init__.py").write_text("")
    (root / "openrlhf" / "trainer" / "ppo_trainer.py").write_text(
        "class BasePPOTrainer:\\n"
        "    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:\\n"
        "        self.saved = global_step\\n")
    sys.path.insert(0, str(root))
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer
    from exporter import progress

    trainer = BasePPOTrainer()
    status = json.loads(sys.argv[2])
    for step in (1, 2, 3):
        trainer.save_logs_and_checkpoints(step, {**status, "policy_loss": 0.1 * step}, {"global_step": step})
    trainer.save_logs_and_checkpoints(4, logs_dict={"eval_pass1": 0.5})  # no rollout: not an RL step
    assert trainer.saved == 4  # OpenRLHF's own method still ran
    assert progress.flush(10)
    print(json.dumps(progress.stats()))
"""


def test_the_hook_reports_openrlhfs_steps_when_its_trainer_module_is_imported(exporter_with_progress,  # noqa: F811
                                                                              tmp_path):
    import json

    exporter, stats = run_hooked(exporter_with_progress, tmp_path, OPENRLHF_RUN, "orlhf-1", str(tmp_path / "pkg"),
                                 json.dumps(STATUS), last_step=3)
    assert stats["dropped"] == stats["rejected"] == 0
    assert stats["sent"] == 6

    def at(family: str, **labels: str) -> float:
        return one(exporter, family, "orlhf-1", **labels)

    assert at("raypulse_train_step") == 3
    assert at("raypulse_train_loss") == pytest.approx(0.3)
    assert at("raypulse_rl_reward_mean") == pytest.approx(0.42)
    assert at("raypulse_rl_phase_seconds_total", phase=wire.RL_WEIGHT_SYNC_PHASE) == pytest.approx(1.5)
    assert at("raypulse_rl_rollouts_total") == 192
