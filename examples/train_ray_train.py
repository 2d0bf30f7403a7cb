"""The same small data-parallel job as train.py, written with Ray Train, healing with the launcher.

Ray Train resumes by itself when the trainer is built again with the same
`RunConfig(storage_path, name)`: here the run's checkpoint dir (RAYPULSE_CHECKPOINT_DIR, which the
launcher gives every attempt of a run) and the run id (RAYPULSE_RUN_ID), so a new attempt after a
hang, a GPU fault or a lost node starts from the last checkpoint Ray Train kept, and
`ray.train.get_checkpoint()` hands it to the training function. `progress.ray_train_report` replaces
`ray.train.report`: the step, loss and checkpoints reach raypulse too (and its watcher).

    launcher submit --workers 2 --working-dir examples -- python train_ray_train.py --steps 60
    pip install 'ray[train]'      # Ray Train's own dependencies (pandas, pyarrow, ...)

--hang-at-step N makes attempt 1 stop making progress at step N (to watch the launcher heal it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import tempfile
import time
from pathlib import Path

import ray.train
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer  # Ray Train V2 (the default)

from exporter import progress

FEATURES = 8
BATCH = 64


def train_loop(config: dict) -> None:
    context = ray.train.get_context()
    rank = context.get_world_rank()
    rng = random.Random(7 + rank)
    true_weights = [-1 + 2 * i / (FEATURES - 1) for i in range(FEATURES)]
    x = [[rng.gauss(0, 1) for _ in range(FEATURES)] for _ in range(512)]
    y = [sum(a * b for a, b in zip(row, true_weights, strict=True)) + rng.gauss(0, 0.1) for row in x]
    weights, first = [0.0] * FEATURES, 1
    checkpoint = ray.train.get_checkpoint()  # the last one Ray Train kept, on a later attempt
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            saved = json.loads((Path(directory) / "state.json").read_text())
        weights, first = saved["weights"], saved["step"] + 1
        print(f"rank {rank}: resumed from step {saved['step']}", flush=True)
    attempt = int(os.environ.get("RAYPULSE_ATTEMPT", "1"))
    for step in range(first, config["steps"] + 1):
        if step == config["hang_at_step"] and attempt == 1:
            time.sleep(3600)  # a hang: no progress, no output
        rows = [rng.randrange(len(x)) for _ in range(BATCH)]
        errors = [(sum(a * b for a, b in zip(x[r], weights, strict=True)) - y[r], r) for r in rows]
        loss = sum(error * error for error, _ in errors) / BATCH
        gradient = [2 * sum(error * x[r][j] for error, r in errors) / BATCH for j in range(FEATURES)]
        weights = [w - config["learning_rate"] * g for w, g in zip(weights, gradient, strict=True)]
        time.sleep(config["step_seconds"])
        metrics = {"step": step, "loss": loss, "samples": BATCH, "grad_norm": math.sqrt(sum(g * g for g in gradient))}
        if step % config["checkpoint_every"] == 0 and rank == 0:
            with tempfile.TemporaryDirectory() as directory:
                (Path(directory) / "state.json").write_text(json.dumps({"step": step, "weights": weights}))
                progress.ray_train_report(metrics, checkpoint=Checkpoint.from_directory(directory))
        else:
            progress.ray_train_report(metrics)
    progress.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--hang-at-step", type=int, default=0)
    args = parser.parse_args()
    storage = os.environ.get("RAYPULSE_CHECKPOINT_DIR") or str(Path(tempfile.gettempdir()) / "ray-train-example")
    trainer = DataParallelTrainer(
        train_loop,
        train_loop_config={"steps": args.steps, "step_seconds": args.step_seconds, "learning_rate": args.learning_rate,
                           "checkpoint_every": args.checkpoint_every, "hang_at_step": args.hang_at_step},
        scaling_config=ScalingConfig(num_workers=args.workers),
        # The same storage and name on every attempt of the run: Ray Train resumes from its last checkpoint.
        run_config=RunConfig(storage_path=storage, name=os.environ.get("RAYPULSE_RUN_ID", "ray-train-example")),
    )
    result = trainer.fit()
    print(f"done: {args.steps} steps, last checkpoint {result.checkpoint}", flush=True)


if __name__ == "__main__":
    main()
