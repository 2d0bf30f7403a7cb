"""Ray RLlib PPO on a small Gym environment, seen by raypulse as RL post-training.

The algorithm is RLlib's own, unchanged; one line (`.callbacks(RaypulseCallback)`) makes every
training iteration an RL iteration on the "RL post-training" board: its phases (sample, learn,
weight sync), rollouts, episode return, KL and entropy, episode lengths and the share truncated at
the limit. Its actors are the board's generator (RLlib's EnvRunner) and trainer (the Learner).

    launcher submit --workers 1 --worker-cpus 2 -- python examples/rllib_ppo.py --iterations 20
    python examples/rllib_ppo.py --iterations 5        # also on a plain `ray.init()`

Needs `ray[rllib]` and PyTorch (CPU is enough): `pip install 'ray[rllib]' torch`.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import ray
from ray.rllib.algorithms.ppo import PPOConfig

try:  # raypulse's RLlib callback; the example still trains without raypulse installed
    from exporter.progress.rllib import RaypulseCallback
except ImportError:  # pragma: no cover - an environment without raypulse
    RaypulseCallback = None


def build_config(env: str = "CartPole-v1", env_config: dict[str, Any] | None = None, learners: int = 1,
                 env_runners: int = 1) -> PPOConfig:
    """PPO as RLlib's CartPole tuned example has it, small enough for 2 CPUs."""
    config = (
        PPOConfig()
        .environment(env, env_config=env_config or {})
        .env_runners(num_env_runners=env_runners, num_envs_per_env_runner=1, num_cpus_per_env_runner=1)
        .learners(num_learners=learners, num_cpus_per_learner=1)
        .training(train_batch_size=400, minibatch_size=100, num_epochs=4, lr=3e-4, vf_loss_coeff=0.01)
        .reporting(metrics_num_episodes_for_smoothing=20)
    )
    return config.callbacks(RaypulseCallback) if RaypulseCallback is not None else config


def train(config: PPOConfig, iterations: int, stop_file: str | None = None) -> float:
    """Train for `iterations` (0: until `stop_file` exists); returns the last mean episode return."""
    algorithm = config.build_algo()
    reward, iteration = float("nan"), 0
    try:
        while iterations == 0 or iteration < iterations:
            started = time.monotonic()
            result = algorithm.train()
            iteration = result["training_iteration"]
            reward = result["env_runners"].get("episode_return_mean", float("nan"))
            print(f"iteration {iteration}: episode return {reward:.1f} ({time.monotonic() - started:.1f}s)",
                  flush=True)
            if stop_file and os.path.exists(stop_file):
                break
    finally:
        algorithm.stop()
    return reward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=20, help="training iterations (0: until --stop-file)")
    parser.add_argument("--env", default="CartPole-v1", help="a Gymnasium environment id")
    parser.add_argument("--learners", type=int, default=1, help="Learner actors (0: learn in the driver)")
    parser.add_argument("--env-runners", type=int, default=1, help="EnvRunner actors")
    parser.add_argument("--stop-file", help="stop after the iteration during which this file appears")
    args = parser.parse_args()
    ray.init()
    reward = train(build_config(args.env, learners=args.learners, env_runners=args.env_runners), args.iterations,
                   args.stop_file)
    print(f"done: episode return {reward:.1f}", flush=True)


if __name__ == "__main__":
    main()
