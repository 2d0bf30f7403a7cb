"""verl's PPO/GRPO loop seen as RL by raypulse, with no change to verl or to the user's code: what
verl's trainer logs each step through `verl.utils.tracking.Tracking.log` (its console, wandb, mlflow
loggers) is also reported to the node's exporter. `launcher submit --framework-metrics` installs it in
every Ray worker of the job (exporter/progress/hooks.py), the TaskRunner actor that runs verl's
`RayPPOTrainer.fit` among them.

A step's metrics (verl.trainer.ppo.metric_utils: `compute_data_metrics`, `compute_timing_metrics`,
`compute_throughout_metrics`, and the actor's update; verl 0.9.1) become:

- a training step (`progress.report`): the policy loss `actor/pg_loss`, `actor/grad_norm`, the learning
  rate `actor/lr`, the step's tokens `perf/total_num_tokens`;
- an RL iteration (`progress.report_iteration`): the phases `timing_s/<name>` (gen, reward,
  old_log_prob, ref, values, adv, update_critic, update_actor, ...; `update_weights` is the weight
  sync), the reward `critic/score/mean`, KL (`actor/kl_loss`, else the in-reward penalty
  `actor/reward_kl_penalty`), `actor/entropy`, response lengths `response_length/mean` and `/max`, and
  the share clipped at the limit `response_length/clip_ratio`.

Validation logs (`val-core/...`) carry none of these and are not reported. A key verl does not log is
left out; nothing is invented (verl logs no reward std or length limit). Never raises into verl.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter import progress
from exporter.contract import wire
from exporter.progress.logged import number

REWARD = "critic/score/mean"
TIMING_PREFIX = "timing_s/"
WHOLE_STEP = "step"  # timing_s/step is the iteration itself, not a phase
PHASE_NAMES = {"update_weights": wire.RL_WEIGHT_SYNC_PHASE}
RANK = 0  # the single controller (the TaskRunner) logs for the whole job


def iteration_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """progress.report_iteration's fields from one step of verl's metrics (those it has)."""
    phases = {PHASE_NAMES.get(name, name): seconds for key in data if key.startswith(TIMING_PREFIX)
              and (name := key[len(TIMING_PREFIX):]) != WHOLE_STEP and (seconds := number(data, key)) is not None}
    kl = number(data, "actor/kl_loss")
    return {"phases": phases or None, "reward_mean": number(data, REWARD),
            "kl": kl if kl is not None else number(data, "actor/reward_kl_penalty"),
            "entropy": number(data, "actor/entropy"),
            "response_length_mean": number(data, "response_length/mean"),
            "response_length_max": number(data, "response_length/max"),
            "truncated_ratio": number(data, "response_length/clip_ratio")}


def report_step(data: Mapping[str, Any], step: Any) -> None:
    """Report one `Tracking.log(data, step)` of verl's trainer; validation and other logs are skipped."""
    try:
        if not isinstance(data, Mapping) or REWARD not in data:
            return
        tokens = number(data, "perf/total_num_tokens")
        progress.report(int(step), loss=number(data, "actor/pg_loss"), grad_norm=number(data, "actor/grad_norm"),
                        learning_rate=number(data, "actor/lr"),
                        tokens=int(tokens) if tokens is not None and tokens >= 0 else None, rank=RANK)
        progress.report_iteration(int(step), **iteration_fields(data), rank=RANK)
    except Exception:  # noqa: BLE001  (a metrics helper must never break training)
        return
