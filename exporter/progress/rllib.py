"""RLlib training seen as RL by raypulse, with no change to the algorithm: one callback class.

    from exporter.progress.rllib import RaypulseCallback
    config = PPOConfig().environment("CartPole-v1").callbacks(RaypulseCallback)

Every training iteration becomes an RL iteration (`progress.report_iteration`) and a training step
(`progress.report`, so the training board, the stall alerts and the launcher's health watcher see
it too):

- phases: the algorithm's own timers (`metrics.log_time((TIMERS, ...))`), timed live through
  `progress.phase`, so a phase that never ends (sampling that never returns) shows as running:
  sampling is `sample`, the learner update `learn`, the weight sync to the EnvRunners
  `weight_sync`, other timers their own names, evaluation `evaluate`;
- rollouts: episodes finished; generated tokens: env steps sampled;
- reward: the episode return (mean, and std over the same episodes), and by module (the reward
  sources: one per policy of a multi-agent run);
- KL and entropy: the learners' `mean_kl_loss` and `entropy`, averaged over the modules;
- response lengths: episode lengths, their limit the env's `max_episode_steps`, and the share of
  episodes truncated at it (from the EnvRunners, where the episodes end);
- weight sync: its time (the `weight_sync` phase) and bytes: the inference-only module's weights
  times the remote EnvRunners that get them.

Written for RLlib's new API stack (EnvRunners and Learners, Ray 2.40+). Never raises into RLlib:
a field it cannot read is left out.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
    TRAINING_ITERATION_TIMER,
    TRAINING_STEP_TIMER,
)

from exporter import progress
from exporter.contract import wire

RANK = 0  # the algorithm (driver) reports; its EnvRunners and Learners only log into its results
PHASE_NAMES = {ENV_RUNNER_SAMPLING_TIMER: "sample", LEARNER_UPDATE_TIMER: "learn",
               SYNCH_WORKER_WEIGHTS_TIMER: wire.RL_WEIGHT_SYNC_PHASE}
WHOLE_ITERATION = frozenset({TRAINING_ITERATION_TIMER, TRAINING_STEP_TIMER})  # not phases: the iteration itself
EVALUATE = "evaluate"
# What the EnvRunners log per episode, reduced over the same episodes as RLlib's episode return.
TRUNCATED = "raypulse_truncated_ratio"
RETURN = "raypulse_episode_return"
RETURN_SQUARED = "raypulse_episode_return_squared"
LENGTH_LIMIT = "raypulse_episode_length_limit"


def phase_name(timer: str) -> str:
    return PHASE_NAMES.get(timer, timer.removesuffix("_timer"))


class _Timed:
    """RLlib's timer and raypulse's phase entered and left together."""

    def __init__(self, timer: Any, phase: contextlib.AbstractContextManager[None]) -> None:
        self.timer, self.phase = timer, phase

    def __enter__(self) -> Any:
        self.phase.__enter__()
        return self.timer.__enter__()

    def __exit__(self, *exc: Any) -> bool | None:
        try:
            return self.timer.__exit__(*exc)
        finally:
            self.phase.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:  # anything else RLlib asks of its timer
        return getattr(self.timer, name)


def _phases_of(metrics: Any) -> None:
    """Make the algorithm's `log_time((TIMERS, name))` blocks raypulse phases too (this instance only)."""
    original = metrics.log_time

    def log_time(key: Any, *args: Any, **kwargs: Any) -> Any:
        timer = original(key, *args, **kwargs)
        if isinstance(key, tuple) and len(key) == 2 and key[0] == TIMERS and key[1] not in WHOLE_ITERATION:
            return _Timed(timer, progress.phase(phase_name(str(key[1])), rank=RANK))
        return timer

    metrics.log_time = log_time


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _mean(values: Iterable[Any]) -> float | None:
    numbers = [n for n in (_number(v) for v in values) if n is not None]
    return sum(numbers) / len(numbers) if numbers else None


def module_stats(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The learners' results of each module (policy) in one `Algorithm.train()` result."""
    return [stats for module, stats in (result.get(LEARNER_RESULTS) or {}).items()
            if module != ALL_MODULES and isinstance(stats, Mapping)]


def iteration_fields(result: Mapping[str, Any]) -> dict[str, Any]:
    """`report_iteration`'s keyword arguments from one `Algorithm.train()` result."""
    runners = result.get(ENV_RUNNER_RESULTS) or {}
    learners = module_stats(result)
    reward, squared = _number(runners.get(RETURN)), _number(runners.get(RETURN_SQUARED))
    by_module = runners.get("module_episode_return_mean")
    return {
        "rollouts": runners.get("num_episodes"),
        "generated_tokens": runners.get("num_env_steps_sampled"),
        "reward_mean": reward if reward is not None else runners.get("episode_return_mean"),
        "reward_std": math.sqrt(max(0.0, squared - reward * reward)) if reward is not None and squared is not None
        else None,
        "rewards": dict(by_module) if isinstance(by_module, Mapping) else None,  # by module (policy)
        "kl": _mean(stats.get("mean_kl_loss") for stats in learners),
        "entropy": _mean(stats.get("entropy") for stats in learners),
        "response_length_mean": runners.get("episode_len_mean"),
        "response_length_max": runners.get("episode_len_max"),
        "response_length_limit": runners.get(LENGTH_LIMIT),
        "truncated_ratio": runners.get(TRUNCATED),
    }


def _length_limit(env_runner: Any) -> float | None:
    """The episode step limit of the EnvRunner's (first sub-)environment: Gymnasium's TimeLimit wrapper
    as made (gym.make(..., max_episode_steps=N) included), else the env's registered limit."""
    env = getattr(env_runner, "env", None)
    for wrapper in _chain(env):
        for sub_env in (getattr(wrapper, "envs", None) or ())[:1]:  # a vector env's first
            for inner in _chain(sub_env):
                limit = _number(inner.__dict__.get("_max_episode_steps")) if hasattr(inner, "__dict__") else None
                if limit is not None:
                    return limit
    return _number(getattr(getattr(env, "spec", None), "max_episode_steps", None))


def _chain(env: Any) -> Iterator[Any]:
    """An env and the envs it wraps, outermost first."""
    for _ in range(32):
        if env is None:
            return
        yield env
        env = env.__dict__.get("env") if hasattr(env, "__dict__") else None


def _nbytes(state: Any) -> int:
    """Bytes of the arrays (numpy or torch) in a nested module state."""
    if isinstance(state, Mapping):
        return sum(_nbytes(value) for value in state.values())
    if hasattr(state, "nbytes"):
        return int(state.nbytes)
    if hasattr(state, "element_size") and hasattr(state, "numel"):
        return int(state.element_size() * state.numel())
    return 0


def weights_bytes(algorithm: Any) -> int | None:
    """What one weight sync moves: the inference-only module's weights, to each remote EnvRunner."""
    module = getattr(getattr(algorithm, "env_runner", None), "module", None)
    if module is None:
        return None
    runners = max(1, int(algorithm.env_runner_group.num_remote_env_runners()))
    return _nbytes(module.get_state(inference_only=True)) * runners


class RaypulseCallback(RLlibCallback):
    """Reports an RLlib algorithm's iterations to raypulse (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._evaluating: contextlib.AbstractContextManager[None] | None = None
        self._weights_bytes: int | None = None

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        with contextlib.suppress(Exception):
            _phases_of(algorithm.metrics)
        with contextlib.suppress(Exception):
            self._weights_bytes = weights_bytes(algorithm)

    def on_episode_end(self, *, episode: Any, env_runner: Any = None, metrics_logger: Any = None,
                       **kwargs: Any) -> None:
        if metrics_logger is None:
            return
        with contextlib.suppress(Exception):
            window = getattr(getattr(env_runner, "config", None), "metrics_num_episodes_for_smoothing", 100)
            episode_return = float(episode.get_return())
            metrics_logger.log_value(TRUNCATED, float(bool(episode.is_truncated)), reduce="mean", window=window)
            metrics_logger.log_value(RETURN, episode_return, reduce="mean", window=window)
            metrics_logger.log_value(RETURN_SQUARED, episode_return**2, reduce="mean", window=window)
            limit = _length_limit(env_runner)
            if limit is not None:
                metrics_logger.log_value(LENGTH_LIMIT, limit, reduce="max", window=1)

    def on_evaluate_start(self, *, algorithm: Any, **kwargs: Any) -> None:
        self._evaluating = progress.phase(EVALUATE, rank=RANK)
        self._evaluating.__enter__()

    def on_evaluate_end(self, *, algorithm: Any, **kwargs: Any) -> None:
        if self._evaluating is not None:
            self._evaluating.__exit__(None, None, None)
            self._evaluating = None

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        with contextlib.suppress(Exception):
            iteration = int(result.get("training_iteration") or algorithm.iteration)
            synced = SYNCH_WORKER_WEIGHTS_TIMER in (result.get(TIMERS) or {})
            progress.report_iteration(iteration, rank=RANK, **iteration_fields(result),
                                      weight_sync_bytes=self._weights_bytes if synced else None)
            learners = module_stats(result)
            progress.report(iteration, loss=_mean(stats.get("total_loss") for stats in learners),
                            samples=(result.get(ENV_RUNNER_RESULTS) or {}).get("num_env_steps_sampled"),
                            learning_rate=_mean(stats.get("default_optimizer_learning_rate") for stats in learners),
                            rank=RANK)
