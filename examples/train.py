"""A small data-parallel training job for Ray that reports its progress to raypulse.

Each of --workers Ray actors (one per worker node's CPU, with a GPU when the cluster has them)
fits its own shard of a synthetic linear-regression problem with minibatch SGD (plain Python, so
the example needs nothing beyond Ray). After
every step the driver averages the workers' weights (an all-reduce, as in data-parallel
training), and every worker reports its step, loss, samples, gradient norm and learning rate
through `exporter.progress` to the raypulse exporter of its own node. Every --checkpoint-every
steps the driver saves the weights and says so (timed, with its path). A later attempt of the same
run resumes from the last checkpoint: the launcher gives every attempt the run's checkpoint dir
(RAYPULSE_CHECKPOINT_DIR) and a new attempt the checkpoint to resume from (RAYPULSE_RESUME_FROM),
both read here through `progress.checkpoint_dir()` and `progress.resume_from()`.

    launcher submit --workers 2 --working-dir examples -- python train.py --steps 60
    python train.py --steps 20            # also runs on a plain `ray.init()` cluster

--fail-at-step N makes attempt 1 fail at step N (to watch a retry); later attempts (the launcher
sets RAYPULSE_ATTEMPT in the job's environment) run through.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import time
from pathlib import Path

import ray

try:  # the raypulse exporter's progress client; the job still trains without it
    from exporter import progress
except ImportError:  # pragma: no cover - an environment without raypulse installed
    progress = None

FEATURES = 8
BATCH = 64


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def mean(vectors: list[list[float]]) -> list[float]:
    return [sum(column) / len(vectors) for column in zip(*vectors, strict=True)]


@ray.remote(num_cpus=1)
class Worker:
    """One data-parallel rank: its shard of the data, an SGD step on the weights it is given."""

    def __init__(self, rank: int, seed: int) -> None:
        self.rank = rank
        self.rng = random.Random(seed + rank)
        true_weights = [-1 + 2 * i / (FEATURES - 1) for i in range(FEATURES)]
        self.x = [[self.rng.gauss(0, 1) for _ in range(FEATURES)] for _ in range(1024)]
        self.y = [dot(row, true_weights) + self.rng.gauss(0, 0.1) for row in self.x]

    def node(self) -> dict:
        context = ray.get_runtime_context()
        return {"rank": self.rank, "node_id": context.get_node_id()[:8], "gpus": ray.get_gpu_ids(),
                "progress_url": os.environ.get("RAYPULSE_PROGRESS_URL")}

    def step(self, step: int, weights: list[float], learning_rate: float, step_seconds: float) -> list[float]:
        rows = [self.rng.randrange(len(self.x)) for _ in range(BATCH)]
        errors = [(dot(self.x[row], weights) - self.y[row], row) for row in rows]
        loss = sum(error * error for error, _ in errors) / BATCH
        gradient = [2 * sum(error * self.x[row][j] for error, row in errors) / BATCH for j in range(FEATURES)]
        time.sleep(step_seconds)  # stands in for the forward/backward pass of a real model
        if progress is not None:
            progress.report(step, loss=loss, samples=BATCH, grad_norm=math.sqrt(dot(gradient, gradient)),
                            learning_rate=learning_rate, rank=self.rank)
        return [w - learning_rate * g for w, g in zip(weights, gradient, strict=True)]

    def loss(self, weights: list[float]) -> float:
        return sum((dot(row, weights) - y) ** 2 for row, y in zip(self.x, self.y, strict=True)) / len(self.x)

    def flush(self) -> None:
        """Send the queued progress reports before the driver ends and Ray stops this actor."""
        if progress is not None:
            progress.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", type=int, default=0, help="data-parallel ranks [one per CPU of the cluster]")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--fail-at-step", type=int, default=0)
    args = parser.parse_args()

    ray.init()
    resources = ray.cluster_resources()
    ranks = args.workers or max(1, int(resources.get("CPU", 1)))
    gpus_per_rank = 1 if resources.get("GPU", 0) >= ranks else 0
    workers = [Worker.options(num_gpus=gpus_per_rank).remote(rank, seed=7) for rank in range(ranks)]
    for placement in ray.get([worker.node.remote() for worker in workers]):
        print(f"rank {placement['rank']} on node {placement['node_id']} gpus={placement['gpus']} "
              f"progress -> {placement['progress_url']}", flush=True)

    attempt = int(os.environ.get("RAYPULSE_ATTEMPT", "1"))  # set by the launcher for each attempt
    checkpoints = Path((progress.checkpoint_dir() if progress else None) or args.checkpoint_dir)
    weights, first = [0.0] * FEATURES, 1
    resume = progress.resume_from() if progress is not None else None
    if resume and resume.get("path") and Path(resume["path"]).exists():
        saved = json.loads(Path(resume["path"]).read_text())
        weights, first = saved["weights"], saved["step"] + 1
        print(f"attempt {attempt} resumes from step {saved['step']} ({resume['path']})", flush=True)
    started = time.monotonic()
    loss = math.nan
    for step in range(first, args.steps + 1):
        if step == args.fail_at_step and attempt == 1:
            raise RuntimeError(f"simulated failure at step {step} (attempt {attempt}); a retry will run through")
        new = ray.get([worker.step.remote(step, weights, args.learning_rate, args.step_seconds) for worker in workers])
        weights = mean(new)  # all-reduce: average the ranks' updates
        if step % args.checkpoint_every == 0 or step == args.steps:
            checkpoint = checkpoints / f"step-{step:06d}.json"
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            with progress.checkpoint(step, path=checkpoint, rank=0) if progress else contextlib.nullcontext():
                checkpoint.write_text(json.dumps({"step": step, "weights": weights}))
            losses = ray.get([worker.loss.remote(weights) for worker in workers])
            loss = sum(losses) / len(losses)
            done = step - first + 1
            print(f"step {step:4d}  loss {loss:.5f}  {done * BATCH * ranks / (time.monotonic() - started):.0f} "
                  f"samples/s  checkpoint {checkpoint}", flush=True)
    ray.get([worker.flush.remote() for worker in workers])
    if progress is not None:
        progress.flush()
    print(f"done: {args.steps} steps on {ranks} ranks, final loss {loss:.5f}", flush=True)


if __name__ == "__main__":
    main()
