"""OpenRLHF's PPO loop seen as RL by raypulse, with no change to OpenRLHF or to the user's code: the status
its trainer hands to `BasePPOTrainer.save_logs_and_checkpoints(global_step, logs_dict, ...)` after every
step (what its wandb and TensorBoard loggers write) is also reported to the node's exporter.
`launcher submit --framework-metrics` installs it in every Ray worker of the job
(exporter/progress/hooks.py): OpenRLHF's PPOTrainer is a Ray actor.

Keys as OpenRLHF 0.11.0 writes them (openrlhf/trainer/ppo_trainer.py: `train_step`,
`_compute_rollout_stats`, `fit`; openrlhf/trainer/ray/ppo_actor.py):

- a training step: `policy_loss`, the learning rate `actor_lr`;
- an RL iteration: the phases `timing/generation` (generate), `timing/make_experience`,
  `timing/ppo_train` (train) and `timing/broadcast` (the weight sync to the vLLM engines;
  `timing/step_total` is the whole step, not a phase), the rollouts `rollout/num_samples`, the reward
  `rollout/reward_mean` and `rollout/reward_std`, `kl`, the response length `rollout/response_length_mean`
  and the share truncated `rollout/truncated_rate`.

OpenRLHF cannot share an environment with raypulse (it pins Ray 2.55, transformers 5.15 and a CUDA build
of flash-attn), so this mapping is tested against those keys, read from its source, not against a run.
Never raises into OpenRLHF.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter import progress
from exporter.contract import wire
from exporter.progress.logged import number

REWARD = "rollout/reward_mean"
PHASES = {"timing/generation": "generate", "timing/make_experience": "make_experience", "timing/ppo_train": "train",
          "timing/broadcast": wire.RL_WEIGHT_SYNC_PHASE}
RANK = 0  # the PPOTrainer actor logs for the whole job


def iteration_fields(status: Mapping[str, Any]) -> dict[str, Any]:
    """progress.report_iteration's fields from one step's status (those it has)."""
    phases = {phase: seconds for key, phase in PHASES.items() if (seconds := number(status, key)) is not None}
    rollouts = number(status, "rollout/num_samples")
    return {"phases": phases or None, "rollouts": int(rollouts) if rollouts is not None and rollouts >= 0 else None,
            "reward_mean": number(status, REWARD), "reward_std": number(status, "rollout/reward_std"),
            "kl": number(status, "kl"), "response_length_mean": number(status, "rollout/response_length_mean"),
            "truncated_ratio": number(status, "rollout/truncated_rate")}


def report_step(status: Any, global_step: Any) -> None:
    """Report one `save_logs_and_checkpoints(global_step, status)` of OpenRLHF's PPO trainer."""
    try:
        if not isinstance(status, Mapping) or REWARD not in status:
            return
        progress.report(int(global_step), loss=number(status, "policy_loss"),
                        learning_rate=number(status, "actor_lr"), rank=RANK)
        progress.report_iteration(int(global_step), **iteration_fields(status), rank=RANK)
    except Exception:  # noqa: BLE001  (a metrics helper must never break training)
        return
