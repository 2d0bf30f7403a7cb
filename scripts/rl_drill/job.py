"""The RL drill's job: examples/rllib_ppo.py's PPO (RLlib, unchanged, with raypulse's callback) on a
CartPole whose faults the drill switches on through a small JSON control file.

    python scripts/rl_drill/job.py --control /tmp/rl-drill/job.json

Control keys (read by the environment at most every 0.2 s, by the callback every iteration):
- "hang": every env step blocks while it is set: sampling never returns (an RL hang);
- "limit": episodes are cut off (truncated) after this many steps (default 100000: never here);
- "sync_delay": seconds each weight sync to the EnvRunners takes on top (a slow sync);
- "flip": the observations' signs flip (a broken preprocessor): the trained policy does the opposite
  of what it learned, and the reward collapses;
- "kl": the KL the callback reports (the drill's stand-in for a policy drifting from its reference;
  the real KL of PPO stays small by construction);
- "stop": the job ends after the current iteration.
The driver writes the pids of its EnvRunner and Learner actors to <control>.actors.json, so the drill
can tie simulated GPUs to them. Everything the workers need is defined here: Ray pickles this
module's classes by value, so the workers need no import path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import ray
from ray.tune.registry import register_env

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from rllib_ppo import build_config  # the example is a script, not a package

from exporter.progress.rllib import RaypulseCallback

ENV = "raypulse-drill-cartpole"
DEFAULT_LIMIT = 100_000


def read_control(path: str) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}  # missing or half-written: no fault


class DrillCartPole(gym.Wrapper):
    """CartPole-v1 without its 500-step limit, with the control file's hang and step limit."""

    def __init__(self, control: str) -> None:
        super().__init__(gym.make("CartPole-v1", max_episode_steps=DEFAULT_LIMIT))
        self.control, self.steps, self.read_at, self.state = control, 0, 0.0, {}
        self._max_episode_steps = DEFAULT_LIMIT  # raypulse's callback reads the limit here

    def _control(self) -> dict[str, Any]:
        if time.monotonic() - self.read_at > 0.2:
            self.state, self.read_at = read_control(self.control), time.monotonic()
        return self.state

    def _observe(self, observation: Any) -> Any:
        return -observation if self._control().get("flip") else observation

    def reset(self, **kwargs: Any) -> Any:
        self.steps = 0
        observation, info = self.env.reset(**kwargs)
        return self._observe(observation), info

    def step(self, action: Any) -> Any:
        while self._control().get("hang"):
            time.sleep(0.2)
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        self._max_episode_steps = int(self._control().get("limit", DEFAULT_LIMIT))
        return (self._observe(observation), reward, terminated, truncated or self.steps >= self._max_episode_steps,
                info)


class DrillCallback(RaypulseCallback):
    """raypulse's callback, plus the faults that live in the algorithm: slow syncs, the reported KL."""

    control = ""  # set by main() before the algorithm is built

    def on_algorithm_init(self, *, algorithm: Any, **kwargs: Any) -> None:
        super().on_algorithm_init(algorithm=algorithm, **kwargs)
        group, control = algorithm.env_runner_group, self.control
        sync = group.sync_weights

        def slow_sync(*args: Any, **kw: Any) -> Any:
            time.sleep(float(read_control(control).get("sync_delay", 0)))
            return sync(*args, **kw)

        group.sync_weights = slow_sync

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        control = read_control(self.control)
        if "kl" in control:
            for module, stats in (result.get("learners") or {}).items():
                if module != "__all_modules__" and isinstance(stats, dict):
                    stats["mean_kl_loss"] = float(control["kl"])
        super().on_train_result(algorithm=algorithm, result=result, **kwargs)


def _values(results: Any) -> list[Any]:
    """A foreach_* call's values: a list, or RLlib's RemoteCallResults of CallResults."""
    return [result.get() if hasattr(result, "get") else result for result in results]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--control", required=True)
    args = parser.parse_args()
    ray.init()
    control = str(Path(args.control).resolve())
    register_env(ENV, lambda config: DrillCartPole(control))
    DrillCallback.control = control
    # The reward over the last 200 episodes: CartPole's per-episode return swings too much for a baseline.
    config = build_config(ENV).callbacks(DrillCallback).reporting(metrics_num_episodes_for_smoothing=200)
    algorithm = config.build_algo()
    pids = {"generator": _values(algorithm.env_runner_group.foreach_env_runner(lambda runner: os.getpid(),
                                                                               local_env_runner=False)),
            "trainer": _values(algorithm.learner_group.foreach_learner(lambda learner: os.getpid()))}
    Path(control).with_suffix(".actors.json").write_text(json.dumps(pids))
    print(f"rl drill job: actors {pids}", flush=True)
    try:
        while not read_control(control).get("stop"):
            result = algorithm.train()
            print(f"rl drill job: iteration {result['training_iteration']}: return "
                  f"{result['env_runners'].get('episode_return_mean', float('nan')):.1f}", flush=True)
    finally:
        algorithm.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
