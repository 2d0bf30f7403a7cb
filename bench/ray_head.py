"""The head collector's cost with a long cluster history: its cycle time and the exporter's RSS with
1,000 finished jobs and 10,000 tasks in Ray's history, beside the Ray dashboard answering the
question every job list asks (the peer, timed in the same minute).

A local head (its own temp dir and free ports, token auth on) gets a history of `--jobs` finished
jobs: `--submitted` of them submitted through the Jobs API with the launcher's metadata
(entrypoint `true`, several in flight; each costs Ray a supervisor process, ~1 s of CPU), the
rest drivers that connect and disconnect (what `ray.init()` in a script makes, listed by the same
Jobs API), and one submitted job that ran `--tasks` tasks, 1% of them failing. Then a real
exporter (`--ray-role head`, default intervals) runs `--cycles` cycles with the default job
window (100 finished jobs exported) and again exporting every finished job. Prints a markdown
table and the targets (cycle < 1 s, RSS < 120 MB). Start Ray only under the shared lock:

    flock /tmp/raypulse-ray.lock .venv/bin/python -m bench.ray_head [--jobs 1000] [--tasks 10000]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.contract import wire
from scripts.ports import free_port
from tests.ray_testcluster import RayCluster, start_cluster, start_exporter, stop_process

REPO = Path(__file__).resolve().parent.parent

TASKS_JOB = """
import ray
ray.init()

@ray.remote(num_cpus=0.01)
def tick(i):
    return i

@ray.remote(num_cpus=0.01, max_retries=0)
def fail(i):
    raise ValueError(i)

done = 0
while done < {tasks}:
    batch = min(1000, {tasks} - done)
    ray.get([tick.remote(i) for i in range(batch)])
    done += batch
for ref in [fail.remote(i) for i in range({failing})]:
    try:
        ray.get(ref)
    except Exception:
        pass
print("ran", done, "tasks")
"""

DRIVERS = """
import ray
from ray.job_config import JobConfig

for i in range({count}):
    metadata = {{"raypulse.job_name": "bench-driver", "raypulse.run_id": f"driver-{{i}}", "raypulse.attempt": "1"}}
    ray.init(address="{address}", job_config=JobConfig(metadata=metadata), logging_level="ERROR",
             log_to_driver=False, include_dashboard=False)
    ray.shutdown()
"""


def rss(pid: int, key: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def populate(cluster: RayCluster, jobs: int, submitted: int, tasks: int, work: Path) -> float:
    """The history: finished jobs and a task-heavy job; returns the seconds it took."""
    started = time.monotonic()
    script = work / "tasks_job.py"
    script.write_text(TASKS_JOB.format(tasks=tasks, failing=max(1, tasks // 100)))
    cluster.submit(f"{sys.executable} {script}", "bench-tasks", {wire.META_JOB_NAME: "tasks"})
    cluster.wait_job("bench-tasks", {"SUCCEEDED", "FAILED"}, timeout=1800)
    drivers = max(0, jobs - submitted)
    if drivers:
        subprocess.run([sys.executable, "-c", DRIVERS.format(count=drivers, address=f"127.0.0.1:{cluster.gcs_port}")],
                       env=cluster.env(), check=True, capture_output=True, timeout=3600)
    sent, in_flight_limit = 0, 24
    while True:
        listed = cluster.api("/api/jobs/")
        active = sum(job["status"] in ("PENDING", "RUNNING") for job in listed)
        finished = sum(job["status"] in ("SUCCEEDED", "FAILED", "STOPPED") for job in listed)
        if finished >= jobs + 1:
            return time.monotonic() - started
        for _ in range(min(in_flight_limit - active, jobs - drivers - sent)):
            run, attempt = divmod(sent, 3)
            cluster.submit("true", f"bench-{sent:05d}", {
                "raypulse.job_name": "bench", "raypulse.run_id": f"bench-run-{run}",
                "raypulse.attempt": str(attempt + 1), "raypulse.max_attempts": "3", "raypulse.user": "bench",
                "raypulse.workspace": "bench", "raypulse.label.team": "perf"})
            sent += 1
        time.sleep(0.5)


def scrape(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        return {f.name: f.samples for f in text_string_to_metric_families(response.read().decode())}


def head_value(families: dict[str, list], family: str) -> float | None:
    for sample in families.get(family, []):
        if sample.labels.get("collector") == "ray_head" and not sample.name.endswith("_created"):
            return sample.value
    return None


def measure(cluster: RayCluster, work: Path, cycles: int, env_extra: dict[str, str]) -> dict:
    port = free_port()
    env = {**cluster.env(), **env_extra}
    exporter = start_exporter(work, port, "--ray-role", "head", "--ray-dashboard", cluster.dashboard_url,
                              "--progress-listen", "off", env=env)
    try:
        durations, seen = [], None
        deadline = time.monotonic() + cycles * 5 * 3 + 60
        while len(durations) < cycles and time.monotonic() < deadline:
            families = scrape(exporter.url)
            last = head_value(families, "raypulse_exporter_collector_last_success_timestamp_seconds")
            if last is not None and last != seen:
                seen = last
                durations.append(head_value(families, "raypulse_exporter_collector_duration_seconds"))
            time.sleep(0.5)
        families = scrape(exporter.url)
        series = sum(len(samples) for name, samples in families.items() if name.startswith(("raypulse_job",
                                                                                              "raypulse_ray")))
        errors = sum(s.value for s in families.get("raypulse_exporter_collector_errors", [])
                     if s.labels.get("collector") == "ray_head" and s.name.endswith("_total"))
        return {"durations": durations, "rss": rss(exporter.process.pid), "peak": rss(exporter.process.pid, "VmHWM"),
                "series": series, "errors": errors,
                "jobs": len({(s.labels["job_id"], s.labels["submission_id"])
                             for s in families.get("raypulse_job_info", [])})}
    finally:
        stop_process(exporter.process)


def peer(cluster: RayCluster, rounds: int = 10) -> dict:
    """The dashboard serving the job list (`ray job list`) and the dashboard's own memory."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        jobs = cluster.api("/api/jobs/")
        times.append(time.perf_counter() - started)
    dashboard = next((int(p) for p in os.listdir("/proc") if p.isdigit() and _is_dashboard(int(p), cluster)), None)
    return {"job_list": statistics.median(times), "jobs": len(jobs),
            "dashboard_rss": rss(dashboard) if dashboard else None}


def _is_dashboard(pid: int, cluster: RayCluster) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return "dashboard/dashboard.py" in cmdline and str(cluster.temp_dir) in cmdline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--submitted", type=int, default=200, help="of --jobs, how many go through the Jobs API")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=24)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rpb-", dir="/tmp"))
    cluster = start_cluster(work / "ray", worker_cpus=(), head_cpus=2)
    try:
        ray_version = cluster.api("/api/version")["ray_version"]
        populated = populate(cluster, args.jobs, args.submitted, args.tasks, work)
        print(f"history: {args.jobs} finished jobs ({min(args.jobs, args.submitted)} submitted, the rest drivers) "
              f"+ a job of {args.tasks} tasks, made in {populated:.0f}s", flush=True)
        runs = {"default window (100 finished jobs exported)": {},
                "every finished job exported": {"RAYPULSE_EXPORTER_RAY__MAX_FINISHED_JOBS": str(args.jobs + 10)}}
        results = {}
        for name, env in runs.items():
            results[name] = measure(cluster, work, args.cycles, env)
            results[name]["peer"] = peer(cluster)
    finally:
        cluster.kill()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nMeasured on {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"Ray {ray_version}:\n")
    print("| run | jobs exported | series | cycle p50 (ms) | cycle p90 (ms) | cycle max (ms) | RSS (MiB) | "
          "peak RSS (MiB) | dashboard job list p50 (ms) | cycle p50 / job list |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        d = sorted(r["durations"]) or [float("nan")]
        p50, p90 = statistics.median(d), d[int(0.9 * (len(d) - 1))]
        print(f"| {name} | {r['jobs']} | {r['series']} | {p50 * 1000:.0f} | {p90 * 1000:.0f} | {max(d) * 1000:.0f} "
              f"| {r['rss'] / 2**20:.1f} | {r['peak'] / 2**20:.1f} | {r['peer']['job_list'] * 1000:.0f} "
              f"| {p50 / r['peer']['job_list']:.2f} |")
    for name, r in results.items():
        worst = max(r["durations"] or [float("inf")])
        print(f"- {name}: slowest of {len(r['durations'])} cycles {worst:.3f} s (target < 1 s: "
              f"{'met' if worst < 1 else 'missed'}); RSS {r['rss'] / 1e6:.0f} MB (target < 120 MB: "
              f"{'met' if r['rss'] < 120e6 else 'missed'}); collector errors {r['errors']:.0f}")
    dashboard = next(iter(results.values()))["peer"]["dashboard_rss"]
    if dashboard:
        print(f"- the Ray dashboard process itself: {dashboard / 2**20:.0f} MiB RSS")


if __name__ == "__main__":
    main()
