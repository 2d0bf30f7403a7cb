"""The healing drill's training job: data-parallel ranks (one Ray actor per worker node) that step
together (the driver waits for every rank each step, as a collective would), report progress through
exporter.progress, checkpoint every --checkpoint-every steps (timed, with a path, so the launcher
can tell the next attempt where to resume) and resume from RAYPULSE_RESUME_FROM.

The drill injects faults from outside (SIGSTOP, XIDs, a killed node) and through a control file read
every step: {"nan": {"attempt": 1, "step": 22}} makes rank 0 report a NaN loss there;
{"silent": {"attempt": 1, "step": 22}} makes a --quiet job (one that prints but reports no progress)
stop printing and sleep. The job writes its ranks' pids and its newest step to --state.

    python job.py --state /tmp/drill/state.json --control /tmp/drill/control.json --ranks 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import ray

from exporter import progress

ATTEMPT = int(os.environ.get("RAYPULSE_ATTEMPT", "1"))


def control(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def now_is(entry: dict | None, step: int) -> bool:
    return bool(entry) and entry.get("attempt") == ATTEMPT and step >= entry.get("step", 0)


@ray.remote(num_cpus=1)
class Rank:
    def __init__(self, rank: int, control_file: str, quiet: bool) -> None:
        self.rank, self.control, self.quiet = rank, Path(control_file), quiet

    def pid(self) -> int:
        return os.getpid()

    def step(self, step: int, seconds: float) -> float:
        time.sleep(seconds)  # the forward and backward pass
        loss = 2.0 * math.exp(-step / 50) + 0.01 * self.rank
        if self.rank == 0 and now_is(control(self.control).get("nan"), step):
            loss = math.nan
        if self.quiet:
            print(f"rank {self.rank} step {step}", flush=True)
        else:
            progress.report(step, loss=loss, samples=32, rank=self.rank)
        return loss

    def flush(self) -> None:
        progress.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-seconds", type=float, default=0.25)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--quiet", action="store_true", help="print every step, report no progress")
    args = parser.parse_args()

    ray.init()
    ranks = [Rank.options(scheduling_strategy="SPREAD").remote(rank, str(args.control), args.quiet)
             for rank in range(args.ranks)]
    pids = ray.get([rank.pid.remote() for rank in ranks])
    checkpoints = Path(progress.checkpoint_dir() or args.state.parent / "checkpoints")
    first = 1
    resume = progress.resume_from()
    if resume and resume.get("path") and Path(resume["path"]).exists():
        first = json.loads(Path(resume["path"]).read_text())["step"] + 1
    print(f"attempt {ATTEMPT} starts at step {first} on {len(ranks)} ranks (pids {pids})", flush=True)
    for step in range(first, args.steps + 1):
        if args.quiet and now_is(control(args.control).get("silent"), step):
            time.sleep(3600)  # silent: no output, no progress
        ray.get([rank.step.remote(step, args.step_seconds) for rank in ranks])
        state = {"attempt": ATTEMPT, "step": step, "pids": pids, "driver": os.getpid(), "time": time.time()}
        args.state.write_text(json.dumps(state))
        if step % args.checkpoint_every == 0:
            path = checkpoints / f"step-{step:05d}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            with progress.checkpoint(step, path=path, rank=0):
                path.write_text(json.dumps({"step": step}))
    ray.get([rank.flush.remote() for rank in ranks])
    progress.flush()
    print(f"attempt {ATTEMPT} done at step {args.steps}", flush=True)


if __name__ == "__main__":
    main()
