"""A small training job for the Ray tests: two actors burn CPU and report progress through
exporter.progress; the first attempt (metadata raypulse.attempt=1) fails, a later one runs until
the stop file named on the command line appears, then reports a checkpoint and succeeds. Each actor
also sets a gauge as a vLLM engine inside Ray names it, through Ray's metrics agent."""

import json
import math
import os
import sys
import time

import ray
from ray.util.metrics import Gauge

from exporter import progress
from exporter.contract import vllm

metadata = json.loads(os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"])["metadata"]
attempt = int(metadata.get("raypulse.attempt", "1"))
stop_file = sys.argv[1]


@ray.remote(num_cpus=1)
class Trainer:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        # As vLLM's engines inside Ray register it (exporter/contract/vllm.py).
        self.requests_running = Gauge(vllm.registered(vllm.REQUESTS_RUNNING), "Requests in the engine's running "
                                      "batch", tag_keys=("model_name", "engine"))
        self.requests_running.set(3 + rank, tags={"model_name": "tiny", "engine": str(rank)})

    def train(self, fail_at_step, stop_file: str) -> int:
        loss = 4.0
        step = 0
        for step in range(100_000):
            started = time.time()
            while time.time() - started < 0.2:  # "compute"
                pass
            loss *= 0.97
            progress.report(step, loss=math.nan if step == 3 else loss, samples=64, tokens=8192,
                            learning_rate=1e-3, grad_norm=1.5, rank=self.rank)
            if step == fail_at_step:
                raise RuntimeError("simulated failure")
            if os.path.exists(stop_file):
                break
        progress.flush(5)
        return step


ray.init()
trainers = [Trainer.remote(rank) for rank in range(2)]
steps = ray.get([t.train.remote(5 if attempt == 1 else None, stop_file) for t in trainers])
progress.checkpoint_saved(max(steps))
progress.flush(5)
print("trained", steps)
