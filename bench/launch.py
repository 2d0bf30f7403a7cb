"""Time from `launcher submit` to a RUNNING job on a head + 2 workers, against the same steps by
hand in the same run, and the launcher's teardown time.

By hand means what a user types for a local head + 2 workers with token auth (the same token
mode, temp dir and the per-node ports that several nodes on one host need):
`ray start --head`, two `ray start --address` (one after the other), `ray job submit --no-wait`,
then polling the Jobs API until the job is RUNNING. The launcher does all of that and starts one
exporter per node. Rounds alternate between the two so machine noise hits both alike.

    flock /tmp/raypulse-ray.lock python -m bench.launch [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from scripts.ports import free_port

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
JOB = ["python", "-c", "import time; time.sleep(8)"]
POLL_S = 0.25  # the launcher polls job status at this interval too


def job_status(dashboard: str, token: str, submission_id: str) -> str | None:
    request = urllib.request.Request(f"{dashboard}/api/jobs/{submission_id}",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return json.loads(response.read())["status"]
    except (OSError, urllib.error.URLError, ValueError, KeyError):
        return None


def by_hand() -> float:
    """Seconds from the first command to RUNNING; cleans up after itself (not timed)."""
    temp = Path(tempfile.mkdtemp(prefix="rpb-"))
    token = secrets.token_hex(32)
    tag = f"bench-{secrets.token_hex(4)}"
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "RAYPULSE_CLUSTER_TAG": tag}
    gcs, dashboard_port = free_port(), free_port()
    dashboard = f"http://127.0.0.1:{dashboard_port}"
    ray = str(BIN / "ray")

    def node_ports() -> list[str]:
        return ["--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port())]

    log = (temp / "commands.log").open("wb")
    started = time.monotonic()
    try:
        subprocess.run([ray, "start", "--head", "--port", str(gcs), "--dashboard-port", str(dashboard_port),
                        "--dashboard-host", "127.0.0.1", "--ray-client-server-port", str(free_port()),
                        "--num-cpus", "0", "--num-gpus", "0", "--temp-dir", str(temp / "h"), *node_ports(),
                        "--disable-usage-stats"], env=env, check=True, stdout=log, stderr=subprocess.STDOUT)
        for index in (1, 2):
            subprocess.run([ray, "start", "--address", f"127.0.0.1:{gcs}", "--num-cpus", "1", "--temp-dir",
                            str(temp / f"w{index}"), *node_ports(), "--disable-usage-stats"],
                           env=env, check=True, stdout=log, stderr=subprocess.STDOUT)
        subprocess.run([ray, "job", "submit", "--address", dashboard, "--submission-id", "bench", "--no-wait",
                        "--", *JOB], env=env, check=True, stdout=log, stderr=subprocess.STDOUT)
        while (status := job_status(dashboard, token, "bench")) != "RUNNING":
            if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                raise SystemExit(f"the by-hand job ended {status} before it was seen RUNNING; see {temp}")
            time.sleep(POLL_S)
        return time.monotonic() - started
    finally:
        kill_tagged(tag)
        shutil.rmtree(temp, ignore_errors=True)


def kill_tagged(tag: str) -> None:
    """Stop every process of one by-hand cluster (never `ray stop`: that would hit other clusters)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("RAYPULSE_CLUSTER_TAG") == tag:
                process.terminate()
                found.append(process)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(found, timeout=15)
    for process in alive:
        process.kill()


def with_launcher(home: Path) -> tuple[float, float]:
    """Seconds from `launcher submit` to its RUNNING line, and from the job's end to the exit."""
    env = {**os.environ, "RAYPULSE_HOME": str(home)}
    base = free_port()
    command = [str(BIN / "launcher"), "submit", "--workers", "2", "--exporter-port", str(20000 + base % 20000),
               "--progress-port", str(40000 + base % 20000), "--", *JOB]
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    running = ended = None
    for line in process.stderr:
        now = time.monotonic()
        if running is None and "RUNNING" in line:
            running = now - started
        if "tearing down" in line:
            ended = now
    process.wait()
    if process.returncode != 0 or running is None or ended is None:
        raise SystemExit(f"launcher submit failed (exit {process.returncode})")
    return running, time.monotonic() - ended


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="rpb-home-"))
    hand, launched, teardown = [], [], []
    try:
        for round_number in range(1, args.rounds + 1):
            hand.append(by_hand())
            to_running, down = with_launcher(home)
            launched.append(to_running)
            teardown.append(down)
            print(f"round {round_number}: by hand {hand[-1]:.2f}s, launcher {launched[-1]:.2f}s "
                  f"(teardown {down:.2f}s)", flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    median_hand, median_launcher = statistics.median(hand), statistics.median(launched)
    print(f"\n| path | to RUNNING, median of {args.rounds} (s) | min | max |\n|---|---|---|---|")
    print(f"| by hand (ray start x3 + ray job submit) | {median_hand:.2f} | {min(hand):.2f} | {max(hand):.2f} |")
    print(f"| launcher submit | {median_launcher:.2f} | {min(launched):.2f} | {max(launched):.2f} |")
    print(f"\nlauncher / by hand = {median_launcher / median_hand:.2f} (target <= 1.1)")
    print(f"launcher teardown: median {statistics.median(teardown):.2f}s (max {max(teardown):.2f}s)")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    main()
