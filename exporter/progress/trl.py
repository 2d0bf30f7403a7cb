"""Hugging Face trainers seen by raypulse with no change to the training code: one TrainerCallback for
TRL's trainers (GRPO, RLOO, PPO, DPO, SFT) and any `transformers.Trainer`.

    from exporter.progress.trl import RaypulseCallback
    trainer = GRPOTrainer(..., callbacks=[RaypulseCallback()])

or nothing at all: `launcher submit --framework-metrics` gives every Trainer built in the job's Ray
workers this callback (exporter/progress/hooks.py, through Ray's worker_process_setup_hook).

Every log the trainer writes (each `logging_steps`) becomes a training step (`progress.report`: loss,
grad norm, learning rate, the tokens seen since the last log), so the training board, the stall alerts
and the launcher's health watcher see it. A log that carries a reward (TRL's online RL trainers: GRPO,
RLOO, PPO) also becomes an RL iteration (`progress.report_iteration`): reward mean and std, by reward
function, KL, entropy, completion lengths (mean, longest, the limit `max_completion_length`) and the
share clipped at that limit. Keys as TRL 1.16 logs them (trl/trainer/grpo_trainer.py, `_metrics`) through
transformers 5's `Trainer.log`; a key a trainer does not log is left out, nothing is invented.

Only the world's process zero reports: its logs are the ones gathered over every process. The end of
training waits (at most FLUSH_SECONDS) for the last reports to leave. Never raises into the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

from exporter import progress
from exporter.progress.logged import number

REWARD = "reward"
FLUSH_SECONDS = 5.0
_REWARD_SOURCE_PREFIX, _REWARD_SOURCE_SUFFIX = "rewards/", "/mean"


def iteration_fields(logs: Mapping[str, Any], completion_limit: float | None) -> dict[str, Any]:
    """progress.report_iteration's fields from one RL log of TRL (those it has)."""
    sources = {key[len(_REWARD_SOURCE_PREFIX):-len(_REWARD_SOURCE_SUFFIX)]: value for key in logs
               if key.startswith(_REWARD_SOURCE_PREFIX) and key.endswith(_REWARD_SOURCE_SUFFIX)
               and (value := number(logs, key)) is not None}
    return {"reward_mean": number(logs, REWARD), "reward_std": number(logs, "reward_std"),
            "rewards": sources or None, "kl": number(logs, "kl"), "entropy": number(logs, "entropy"),
            "response_length_mean": number(logs, "completions/mean_length"),
            "response_length_max": number(logs, "completions/max_length"),
            "response_length_limit": completion_limit,
            "truncated_ratio": number(logs, "completions/clipped_ratio")}


class RaypulseCallback(TrainerCallback):
    """Reports what the trainer logs to the node's exporter (exporter.progress)."""

    def __init__(self) -> None:
        self._tokens_seen: float | None = None  # `num_tokens` is a running total; progress.report wants steps

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
               **kwargs: Any) -> None:
        try:
            if logs is None or not state.is_world_process_zero or ("loss" not in logs and REWARD not in logs):
                return  # the end-of-training summary, an evaluation: not a training step
            step = int(state.global_step)
            tokens_seen = number(logs, "num_tokens")
            tokens = None
            if tokens_seen is not None:
                before = self._tokens_seen or 0.0
                tokens = int(tokens_seen - before) if tokens_seen >= before else None
                self._tokens_seen = tokens_seen
            progress.report(step, loss=number(logs, "loss"), grad_norm=number(logs, "grad_norm"),
                            learning_rate=number(logs, "learning_rate"), tokens=tokens, rank=0)
            if REWARD in logs:
                limit = getattr(args, "max_completion_length", None)
                limit = float(limit) if isinstance(limit, (int, float)) and limit > 0 else None
                progress.report_iteration(step, **iteration_fields(logs, limit), rank=0)
        except Exception:  # noqa: BLE001  (a metrics helper must never break training)
            return

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The process often ends with training (a Ray actor's method returns, a script exits): the last
        # logs are sent before that, within FLUSH_SECONDS.
        progress.flush(FLUSH_SECONDS)
