"""What the progress client (exporter/progress/client.py) costs the training loop that calls it, per call.

A loop does a trivial unit of work (--work multiply-adds in pure Python, about 4 microseconds) and,
in turn: nothing (the bare loop), `progress.report(step, loss=...)`, `with progress.phase("x")` (two
reports: start and end), `progress.report_iteration(...)` with every RL field. Each case runs in its
own process (a fresh client, its own sender thread), twice: against a real `exporter serve` whose
progress endpoint listens on a free port, and against a port nothing listens on (the client must
neither block nor raise). Within a process, rounds alternate the bare loop and the case so machine
noise hits both alike; the best round of each counts (as timeit: noise only adds). Per call: CPU
time of the calling thread, CPU time of the whole process (the sender thread's JSON and HTTP
included) and wall time, minus the bare loop's, and the calling thread's extra CPU as a multiple of
one bare iteration. What the client sent, dropped (queue full at this rate, or no exporter) and
still held after a 5 s flush.

    python -m bench.progress_client [--calls 5000] [--rounds 7] [--work 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from scripts.ports import free_port

REPO = Path(__file__).resolve().parent.parent
CASES = ("report", "phase", "report_iteration")
SUBMISSION_ID = "bench-progress-1"


def work(units: int) -> float:
    value = 1.0
    for _ in range(units):
        value = value * 1.0000001 + 1e-9
    return value


def loop(case: str, calls: int, units: int) -> None:
    from exporter import progress

    if case == "bare":
        for _ in range(calls):
            work(units)
    elif case == "report":
        for step in range(calls):
            progress.report(step, loss=work(units))
    elif case == "phase":
        for _ in range(calls):
            with progress.phase("x"):
                work(units)
    else:
        for step in range(calls):
            reward = work(units)
            progress.report_iteration(
                step, phases={"reward": 0.01}, rollouts=64, generated_tokens=8192, reward_mean=reward,
                reward_std=0.1, rewards={"correctness": 0.5, "format": 0.9}, kl=0.01, entropy=1.2,
                response_length_mean=128.0, response_length_max=512, response_length_limit=512,
                truncated_ratio=0.02, weight_sync_seconds=0.5, weight_sync_bytes=2**30)


def measure(run: Callable[[], None], calls: int) -> tuple[float, float, float]:
    """Microseconds per call: calling thread CPU, process CPU, wall."""
    thread, process, wall = time.thread_time(), time.process_time(), time.perf_counter()
    run()
    return tuple((now - then) / calls * 1e6 for now, then in (
        (time.thread_time(), thread), (time.process_time(), process), (time.perf_counter(), wall)))


def child(case: str, calls: int, rounds: int, units: int) -> dict:
    """One case in this process: per round the bare loop, then the case; the best round of each (as timeit)."""
    from exporter import progress

    loop(case, 50, units)  # the first call starts the sender thread and looks up the identity
    bare, timed = [], []
    for _ in range(rounds):
        bare.append(measure(lambda: loop("bare", calls, units), calls))
        timed.append(measure(lambda: loop(case, calls, units), calls))
    progress.flush(5.0)
    best = [[min(values) for values in zip(*samples, strict=True)] for samples in (bare, timed)]
    return {"bare": best[0], "case": best[1], "stats": progress.stats()}


def start_exporter(progress_port: int) -> subprocess.Popen:
    port = free_port()
    env = {**os.environ, "RAYPULSE_EXPORTER_PROGRESS__TOKEN": "off",
           "RAYPULSE_EXPORTER_RAY__DASHBOARD_URL": f"http://127.0.0.1:{free_port()}"}  # no Ray here
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{port}",
         "--progress-listen", f"127.0.0.1:{progress_port}"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
                if response.status == 200:
                    return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the exporter on port {port} did not become ready in 60 s")


def run_child(case: str, url: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "RAYPULSE_PROGRESS_URL": url, "RAYPULSE_SUBMISSION_ID": SUBMISSION_ID}
    for name in ("RAY_JOB_ID", "RAYPULSE_PROGRESS_TOKEN"):
        env.pop(name, None)
    output = subprocess.run(
        [sys.executable, "-m", "bench.progress_client", "--child", case, "--calls", str(args.calls),
         "--rounds", str(args.rounds), "--work", str(args.work)],
        cwd=REPO, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(output.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per case (the best counts)")
    parser.add_argument("--work", type=int, default=200, help="multiply-adds in one unit of work")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.calls, args.rounds, args.work)))
        return 0

    progress_port = free_port()
    exporter = start_exporter(progress_port)
    try:
        endpoints = {"exporter": f"http://127.0.0.1:{progress_port}",
                     "none listening": f"http://127.0.0.1:{free_port()}"}
        results = {(case, name): run_child(case, url, args) for name, url in endpoints.items() for case in CASES}
    finally:
        exporter.terminate()
        exporter.wait(10)

    bare = statistics.median(result["bare"][0] for result in results.values())
    print(f"\n{args.calls} calls x {args.rounds} rounds per case; a bare loop iteration (--work {args.work}) "
          f"takes {bare:.2f} us of CPU (median over the cases of their best bare round)\n")
    print("| call | endpoint | calling thread CPU (us/call) | process CPU (us/call) | wall (us/call) "
          "| thread CPU / bare iteration | sent | dropped | queued |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (case, name), result in results.items():
        extra = [case_value - bare_value for case_value, bare_value in zip(result["case"], result["bare"], strict=True)]
        stats = result["stats"]
        print(f"| `{case}` | {name} | {extra[0]:.2f} | {extra[1]:.2f} | {extra[2]:.2f} "
              f"| {extra[0] / result['bare'][0]:.2f} | {stats['sent']} | {stats['dropped']} | {stats['queued']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
