"""RL post-training in the shape of an LLM's (GRPO with a KL penalty), small enough for a CPU, on Ray.

--generators `Generator` actors sample responses to prompts from a tiny policy (a table of logits by
prompt, position and token over a 10-token vocabulary, token 0 the end of sequence), one group of
--group-size responses per prompt, each cut off at --max-new-tokens. Two reward sources score them:
`correctness` (the share of the target, counting up from the prompt token, produced before the first
mistake) and `format` (the response ends instead of being cut off). The `Trainer` actor holds the
policy and a frozen reference copy: it gives the reference log-probs of the batch, then takes one
policy-gradient step with group-normalized advantages and a KL penalty towards the reference. Its
new weights go to every generator through the object store (one `ray.put`, one method call each).
The driver times each phase with `progress.phase(...)` and reports every iteration with
`progress.report_iteration(...)`: the `raypulse_rl_*` series and the "RL post-training" dashboard.

    launcher submit --workers 1 -- python examples/rl_post_training.py --iterations 20
    python examples/rl_post_training.py --iterations 20    # also on a plain `ray.init()` cluster

The reward (at most 1.25) climbs from about 0.15 to 0.7-1.0 in 20 iterations; nothing is checkpointed.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np
import ray

try:  # the raypulse exporter's progress client; the example still trains without it
    from exporter import progress
except ImportError:  # pragma: no cover - an environment without raypulse installed
    progress = None

VOCAB = 10  # token 0 ends a response; prompts are the tokens 1..9
EOS = 0
FORMAT_WEIGHT = 0.25  # reward = correctness + FORMAT_WEIGHT * format


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def target(prompt: int) -> list[int]:
    """The right answer to a prompt: count up from it (1..9, wrapping), 2 to 5 tokens, then EOS."""
    return [(prompt - 1 + i) % (VOCAB - 1) + 1 for i in range(2 + prompt % 4)] + [EOS]


@ray.remote
class Generator:
    """A rollout worker (vLLM's place in a real run): samples responses from the weights it was last given."""

    def __init__(self, seed: int, decode_step_seconds: float) -> None:
        self.rng = np.random.default_rng(seed)
        self.decode_step_seconds = decode_step_seconds
        self.logits: np.ndarray | None = None

    def set_weights(self, logits: np.ndarray) -> None:
        self.logits = logits

    def generate(self, prompts: np.ndarray, max_new_tokens: int) -> dict[str, np.ndarray]:
        """Responses as tokens (padded with -1), their lengths (EOS included) and whether each was cut off."""
        assert self.logits is not None, "set_weights first"
        count = len(prompts)
        tokens = np.full((count, max_new_tokens), -1)
        alive = np.ones(count, dtype=bool)
        for position in range(max_new_tokens):
            probs = np.exp(log_softmax(self.logits[prompts, position]))
            drawn = (probs.cumsum(axis=1) > self.rng.random((count, 1))).argmax(axis=1)
            tokens[alive, position] = drawn[alive]
            alive &= drawn != EOS
            if not alive.any():
                break
        lengths = (tokens >= 0).sum(axis=1)
        time.sleep(self.decode_step_seconds * lengths.max())  # batched decoding lasts as long as its longest response
        return {"prompts": prompts, "tokens": tokens, "lengths": lengths, "truncated": alive}


def score(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each reward source's score of each response."""
    correctness = np.zeros(len(batch["prompts"]))
    for i, (prompt, response) in enumerate(zip(batch["prompts"], batch["tokens"], strict=True)):
        want = target(int(prompt))
        right = next((j for j, token in enumerate(want) if j >= len(response) or response[j] != token), len(want))
        correctness[i] = right / len(want)
    return {"correctness": correctness, "format": (~batch["truncated"]).astype(float)}


@ray.remote
class Trainer:
    """The policy being trained and its frozen reference: reference log-probs, GRPO steps, weights out."""

    def __init__(self, max_new_tokens: int, learning_rate: float, kl_coef: float, train_seconds: float) -> None:
        self.policy = np.zeros((VOCAB, max_new_tokens, VOCAB))  # logits by prompt, position, token
        self.reference = log_softmax(self.policy.copy())
        self.learning_rate, self.kl_coef, self.train_seconds = learning_rate, kl_coef, train_seconds

    def publish_weights(self) -> tuple[list[ray.ObjectRef], int]:
        """The policy in the object store, for the generators to fetch (a list: Ray passes the ref as is)."""
        return [ray.put(self.policy)], self.policy.nbytes

    def reference_logprobs(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """The reference's log-probs over the vocabulary at every position of every response."""
        return self.reference[batch["prompts"]]

    def train(self, batch: dict[str, np.ndarray], reward: np.ndarray, group_size: int,
              reference: np.ndarray) -> dict[str, float]:
        """One policy-gradient step: advantage = reward normalized within its prompt's group, minus
        kl_coef * KL(policy || reference) at every generated position."""
        groups = reward.reshape(-1, group_size)
        advantage = ((groups - groups.mean(axis=1, keepdims=True)) / (groups.std(axis=1, keepdims=True) + 1e-6)).ravel()
        logp = log_softmax(self.policy[batch["prompts"]])  # (responses, positions, vocab)
        probs = np.exp(logp)
        generated = batch["tokens"] >= 0
        chosen = np.eye(VOCAB)[np.where(generated, batch["tokens"], 0)]
        kl_token = (probs * (logp - reference)).sum(axis=-1)  # exact KL at each position
        entropy = -(probs * logp).sum(axis=-1)
        # gradient of mean(advantage * log p(token)) - kl_coef * mean(KL), with respect to the logits
        grad = advantage[:, None, None] * (chosen - probs)
        grad -= self.kl_coef * probs * (logp - reference - kl_token[..., None])
        grad *= generated[..., None] / group_size  # a mean over each prompt's group
        np.add.at(self.policy, batch["prompts"], self.learning_rate * grad)
        time.sleep(self.train_seconds)  # a real model's forward and backward passes
        return {"kl": float(kl_token[generated].mean()), "entropy": float(entropy[generated].mean())}


def phase(name: str) -> contextlib.AbstractContextManager[None]:
    """`progress.phase(name)`, or nothing without raypulse."""
    return progress.phase(name) if progress is not None else contextlib.nullcontext()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--generators", type=int, default=2, help="Generator actors")
    parser.add_argument("--group-size", type=int, default=8, help="responses per prompt (the GRPO group)")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="a response is cut off at this length")
    parser.add_argument("--learning-rate", type=float, default=3.0)
    parser.add_argument("--kl-coef", type=float, default=0.05)
    parser.add_argument("--decode-step-seconds", type=float, default=0.08,
                        help="decoding time per token (of the longest response of a batch)")
    parser.add_argument("--train-seconds", type=float, default=0.2, help="stands in for a forward/backward pass")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    ray.init()
    share = max(0.01, ray.cluster_resources().get("CPU", 1) / (args.generators + 1))  # fit any cluster
    trainer = Trainer.options(num_cpus=share).remote(
        args.max_new_tokens, args.learning_rate, args.kl_coef, args.train_seconds)
    generators = [Generator.options(num_cpus=share).remote(args.seed + i, args.decode_step_seconds)
                  for i in range(args.generators)]
    (weights,), _ = ray.get(trainer.publish_weights.remote())
    ray.get([generator.set_weights.remote(weights) for generator in generators])
    prompts = np.repeat(np.arange(1, VOCAB), args.group_size)  # every prompt, a group of responses each
    started = time.monotonic()
    for iteration in range(args.iterations):
        with phase("generate"):
            shards = np.array_split(prompts.reshape(-1, args.group_size), len(generators))  # whole groups
            parts = ray.get([generator.generate.remote(shard.ravel(), args.max_new_tokens)
                             for generator, shard in zip(generators, shards, strict=False) if shard.size])
            batch = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
        with phase("score"):
            rewards = score(batch)
            reward = rewards["correctness"] + FORMAT_WEIGHT * rewards["format"]
        with phase("reference"):
            reference = ray.get(trainer.reference_logprobs.remote(batch))
        with phase("train"):
            stats = ray.get(trainer.train.remote(batch, reward, args.group_size, reference))
        with phase("weight_sync"):
            (weights,), nbytes = ray.get(trainer.publish_weights.remote())
            ray.get([generator.set_weights.remote(weights) for generator in generators])  # each fetches them
        lengths = batch["lengths"]
        if progress is not None:
            progress.report_iteration(
                iteration, rollouts=len(lengths), generated_tokens=int(lengths.sum()),
                reward_mean=float(reward.mean()), reward_std=float(reward.std()),
                rewards={name: float(values.mean()) for name, values in rewards.items()},
                kl=stats["kl"], entropy=stats["entropy"], response_length_mean=float(lengths.mean()),
                response_length_max=int(lengths.max()), response_length_limit=args.max_new_tokens,
                truncated_ratio=float(batch["truncated"].mean()), weight_sync_bytes=nbytes * len(generators))
        print(f"iteration {iteration:3d}  reward {reward.mean():.3f}  correctness {rewards['correctness'].mean():.3f}  "
              f"format {rewards['format'].mean():.3f}  kl {stats['kl']:.4f}  entropy {stats['entropy']:.3f}  "
              f"length {lengths.mean():.2f}  truncated {batch['truncated'].mean():.2f}", flush=True)
    if progress is not None:
        progress.flush()
    print(f"done: {args.iterations} iterations, {len(prompts)} rollouts each, on {len(generators)} generators "
          f"in {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
