"""The fault drill's training job: a real Ray job whose ranks (actors) report progress through
`exporter.progress`, and whose faults the drill switches on through a small JSON control file.

    python scripts/drill/job.py --control /tmp/drill/job.json --ranks 2

Control file keys (each rank re-reads it every step): "nan" (rank 0 reports a NaN loss), "stall"
(every rank stops making progress and the driver stops logging: a hang), "fail" (the ranks
raise: the job fails), "stop" (the ranks return: the job succeeds). The driver writes each rank's
pid, node and GPU ids to <control>.ranks.json, so the drill can attribute a GPU to the job.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import ray


def read_control(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or half-written: no fault


@ray.remote(max_restarts=0)
class Rank:
    def __init__(self, rank: int, control: str) -> None:
        self.rank, self.control = rank, Path(control)

    def where(self) -> dict:
        return {"rank": self.rank, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "gpu_ids": [int(gpu) for gpu in ray.get_gpu_ids()]}

    def run(self, interval: float) -> int:
        from exporter import progress  # imported in the worker, where RAYPULSE_PROGRESS_URL points

        step = 0
        while True:
            control = read_control(self.control)
            if control.get("stop"):
                progress.flush()
                return step
            if control.get("fail"):
                raise RuntimeError(f"drill: injected failure in rank {self.rank} at step {step}")
            if control.get("stall"):
                time.sleep(0.2)  # hung: alive, holding its resources, no progress
                continue
            loss = 2.0 / (1 + step / 200) + random.uniform(-0.01, 0.01)
            if control.get("nan") and self.rank == 0:
                loss = math.nan
            progress.report(step, loss=loss, samples=64, tokens=64 * 512, learning_rate=1e-3, grad_norm=1.0)
            if step % 25 == 0:
                progress.checkpoint_saved(step)
            step += 1
            time.sleep(interval)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--gpu-rank", action="store_true", help="rank 0 asks Ray for one GPU")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds per training step")
    args = parser.parse_args()
    ray.init()
    ranks = [Rank.options(num_cpus=1, num_gpus=1 if rank == 0 and args.gpu_rank else 0).remote(rank, str(args.control))
             for rank in range(args.ranks)]
    where = ray.get([rank.where.remote() for rank in ranks])
    args.control.with_suffix(".ranks.json").write_text(json.dumps(where))
    print(f"drill job: {len(ranks)} ranks started: {where}", flush=True)
    pending = [rank.run.remote(args.interval) for rank in ranks]
    while pending:
        done, pending = ray.wait(pending, timeout=2.0)
        steps = ray.get(done)  # raises if a rank failed: the job fails
        if steps:
            print(f"drill job: ranks finished after {steps} steps", flush=True)
        elif not read_control(args.control).get("stall"):
            print(f"drill job: training ({time.strftime('%H:%M:%S')})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
