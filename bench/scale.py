"""raypulse at cluster scale, measured by simulation on this machine (issue 26): one section per part,
each at 10 / 200 / 2,000 nodes (or --sizes), today's code beside a baseline checkout in one run.

Sections (`--section NAME`, repeatable; all by default):

- `head`: the head exporter against the fake Ray dashboard (bench/fakeray.py: Ray 2.60's State and
  Jobs API with their limits, envelope and filters, in a process of its own) of a cluster of N nodes,
  A actors, T tasks and J jobs. A real `exporter serve --ray-role head` (default collectors and
  intervals) collects for `--warmup` seconds (a start reads every job once, 8 a collection), then
  `--cycles` intervals with no client (its CPU, utime + stime as a share of one core, its RSS, and
  what the dashboard served per collection), then `--cycles` collections while a client asks /healthz
  every 10 ms (/healthz p50/p99 while a collection runs: a request overlapping [end - duration, end]
  of one; and overall). Also printed: the collection time (the collector's own duration), and whether
  the numbers are right: actors by state against the fake cluster's truth, and the /sd targets whose
  port is the deployed exporter's. A `floor` row: the same exporter as a worker (no head collection),
  this machine's own /healthz noise in the same minutes.

- `launcher`: the launcher's health watcher and run recorder against a fake fleet of N node exporters
  serving a real 8-GPU node's bytes (bench/scale_launcher.py; best with `--sizes 10,100,500,2000`).

- `prometheus`: a real Prometheus scraping that fleet, with and without the cut: series, samples/s and
  memory, extrapolated to 2,000 nodes (bench/prometheus_size.py; best with `--sizes 50,200,400`).

More sections register themselves in SECTIONS the same way.

    python -m bench.scale [--section head] [--sizes 10,200,2000] [--cycles 6] [--warmup 60] [--baseline DIR]

`--baseline DIR`: the same runs from another checkout (e.g. `git worktree add /tmp/base HEAD`, or
`git archive HEAD | tar -x -C /tmp/base`), started with this interpreter in that directory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from scripts.ports import free_port

REPO = Path(__file__).resolve().parent.parent
NO_SUCH_RAY_NODE = "0" * 56  # no raylet of this host is watched
INTERVAL_SECONDS = 5.0  # the ray_head collector's default interval
# nodes -> (actors, tasks, jobs): the cluster shapes of issue 26.
SHAPES = {10: (1_000, 10_000, 100), 200: (10_000, 100_000, 300), 500: (30_000, 300_000, 500),
          2000: (100_000, 1_000_000, 1_000)}


def get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the fake dashboard, in its own process -------------------------------------------------------

@dataclass
class Fake:
    process: subprocess.Popen
    url: str
    metrics_url: str

    def served(self) -> dict[str, Any]:
        return json.loads(get(self.url + "/fake/served"))

    def truth(self) -> dict[str, Any]:
        return json.loads(get(self.url + "/fake/truth", timeout=60))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def start_fake(nodes: int, actors: int, tasks: int, jobs: int) -> Fake:
    port, metrics_port = free_port(), free_port()
    process = subprocess.Popen([sys.executable, "-m", "bench.fakeray", "--nodes", str(nodes), "--actors", str(actors),
                                "--tasks", str(tasks), "--jobs", str(jobs), "--port", str(port),
                                "--metrics-port", str(metrics_port)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()  # one JSON line once it serves
    if not line:
        raise SystemExit("the fake dashboard did not start")
    started = json.loads(line)
    return Fake(process, started["dashboard"], started["metrics"])


# -- the head section -----------------------------------------------------------------------------

@dataclass
class HeadRun:
    name: str
    durations: list[float] = field(default_factory=list)
    healthz: list[tuple[float, float]] = field(default_factory=list)  # (start wall time, seconds)
    windows: list[tuple[float, float]] = field(default_factory=list)  # collections: (start, end) wall times
    cpu: float = 0.0  # share of one core over the window
    rss: int = 0
    peak: int = 0
    served_bytes: int = 0
    served_requests: int = 0
    series: int = 0
    actors_right: str = ""
    sd_right: str = ""
    errors: float = 0.0

    def during(self) -> list[float]:
        return [seconds for start, seconds in self.healthz
                if any(a <= start + seconds and start <= b for a, b in self.windows)]


def scrape(url: str) -> dict[str, list]:
    request = urllib.request.Request(url + "/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def head_sample(families: dict[str, list], family: str) -> float | None:
    for sample in families.get(family, []):
        if sample.labels.get("collector") == "ray_head" and not sample.name.endswith("_created"):
            return sample.value
    return None


def hammer(url: str, run: HeadRun, stop: threading.Event) -> None:
    """/healthz every 10 ms on one keep-alive connection, as a liveness probe would."""
    import http.client

    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    while not stop.is_set():
        started_wall, started = time.time(), time.perf_counter()
        try:
            connection.request("GET", "/healthz")
            connection.getresponse().read()
        except OSError:
            connection.close()
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            continue
        run.healthz.append((started_wall, time.perf_counter() - started))
        time.sleep(0.01)


def run_head(name: str, fake: Fake, cycles: int, cwd: Path, metrics_url: bool = True, role: str = "head",
             warmup: float = 0.0) -> HeadRun:
    """`metrics_url`: tell the exporter where the head's metrics agent is (a checkout that knows the setting);
    `warmup`: seconds of collections before the measured ones."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    if metrics_url:
        env["RAYPULSE_EXPORTER_RAY__METRICS_URL"] = fake.metrics_url
    process = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{port}",
                                "--log-level", "error", "--progress-listen", "off", "--ray-role", role,
                                "--ray-node-id", NO_SUCH_RAY_NODE, "--ray-dashboard", fake.url], cwd=cwd, env=env)
    url = f"http://127.0.0.1:{port}"
    run = HeadRun(name)
    try:
        def first_collection() -> bool:
            if process.poll() is not None:
                raise SystemExit(f"{name}: the exporter exited with {process.returncode}")
            return head_sample(scrape(url), "raypulse_exporter_collector_last_success_timestamp_seconds") is not None

        wait_for(first_collection, 180, f"{name}: a first ray_head collection")
        time.sleep(warmup)  # first reads of every job (at most 8 a collection) are not the steady state
        fake.served()  # what was read until now is not counted
        # CPU and what was read: `cycles` intervals with no client at all.
        cpu_start, wall_start = cpu_seconds(process.pid), time.monotonic()
        first = head_sample(scrape(url), "raypulse_exporter_collector_runs")
        time.sleep(cycles * INTERVAL_SECONDS)
        run.cpu = (cpu_seconds(process.pid) - cpu_start) / (time.monotonic() - wall_start)
        collections = max(1.0, (head_sample(scrape(url), "raypulse_exporter_collector_runs") or 0) - (first or 0))
        served = fake.served()
        run.served_bytes = int(sum(served["bytes"].values()) / collections)
        run.served_requests = int(sum(served["requests"].values()) / collections)
        run.rss, run.peak = proc_status(process.pid, "VmRSS"), proc_status(process.pid, "VmHWM")
        # Latency: /healthz every 10 ms while `cycles` collections run, each one's time from the collector.
        stop = threading.Event()
        thread = threading.Thread(target=hammer, args=(url, run, stop), daemon=True)
        thread.start()
        seen = head_sample(scrape(url), "raypulse_exporter_collector_last_success_timestamp_seconds")
        deadline = time.monotonic() + cycles * INTERVAL_SECONDS * 4 + 120
        while len(run.durations) < cycles and time.monotonic() < deadline:
            families = scrape(url)
            last = head_sample(families, "raypulse_exporter_collector_last_success_timestamp_seconds")
            if last is not None and last != seen:
                seen = last
                duration = head_sample(families, "raypulse_exporter_collector_duration_seconds") or 0.0
                run.durations.append(duration)
                run.windows.append((last - duration, last))
            time.sleep(1.0)
        stop.set()
        thread.join(15)
        if role == "head":
            run.actors_right, run.sd_right, run.series, run.errors = check_head(url, fake.truth())
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
    return run


def check_head(url: str, truth: dict[str, Any]) -> tuple[str, str, int, float]:
    families = scrape(url)
    actors = {s.labels["state"]: s.value for s in families.get("raypulse_ray_actors", [])}
    right = sum(actors.get(state) == count for state, count in truth["actors"].items())
    actors_right = f"{right}/{len(truth['actors'])} states"
    groups = json.loads(get(url + "/sd"))
    found = {g["labels"]["ray_node_id"]: g["targets"][0] for g in groups}
    sd_right = f"{sum(found.get(node) == target for node, target in truth['targets'].items())}/{len(truth['targets'])}"
    series = sum(len(samples) for name, samples in families.items()
                 if name.startswith(("raypulse_job", "raypulse_ray")))
    errors = sum(s.value for s in families.get("raypulse_exporter_collector_errors", [])
                 if s.labels.get("collector") == "ray_head" and s.name.endswith("_total"))
    return actors_right, sd_right, series, errors


def head_section(sizes: list[int], cycles: int, baseline: Path | None, warmup: float) -> None:
    rows = []
    floor: HeadRun | None = None
    for nodes in sizes:
        actors, tasks, jobs = SHAPES.get(nodes, (nodes * 50, nodes * 500, max(10, nodes // 2)))
        print(f"head: {nodes} nodes, {actors:,} actors, {tasks:,} tasks, {jobs:,} jobs ...", file=sys.stderr,
              flush=True)
        fake = start_fake(nodes, actors, tasks, jobs)
        try:
            shape = f"{nodes} / {actors:,} / {tasks:,} / {jobs:,}"
            if floor is None:  # this machine's own noise: the same exporter as a worker, no head collection
                floor = run_head("floor (worker role)", fake, cycles, REPO, role="worker")
            if baseline:
                rows.append((shape, run_head("baseline", fake, cycles, baseline, metrics_url=False, warmup=warmup)))
            rows.append((shape, run_head("this checkout", fake, cycles, REPO, warmup=warmup)))
        finally:
            fake.stop()
    print(f"\n### Head exporter vs cluster size (bench.scale --section head, {cycles} collections each)\n")
    print(f"Measured on {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          "the fake dashboard in its own process, the exporter with default collectors and intervals.\n")
    print("| nodes / actors / tasks / jobs | code | collection p50 (s) | max (s) | /healthz p50 / p99 during a "
          "collection (ms) | /healthz p99 overall (ms) | CPU (% of a core) | RSS / peak (MB) | read per collection "
          "(MB, requests) | series | actors by state right | /sd ports right | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    if floor is not None:
        overall = [seconds for _, seconds in floor.healthz]
        print(f"| (any) | {floor.name} | - | - | - | {percentile(overall, 0.99) * 1000:.1f} | {floor.cpu * 100:.1f} | "
              f"{floor.rss / 1e6:.0f} / {floor.peak / 1e6:.0f} | - | - | - | - | - |")
    for shape, run in rows:
        during = run.during()
        overall = [seconds for _, seconds in run.healthz]
        print(f"| {shape} | {run.name} | {statistics.median(run.durations or [float('nan')]):.2f} | "
              f"{max(run.durations or [float('nan')]):.2f} | {percentile(during, 0.5) * 1000:.1f} / "
              f"{percentile(during, 0.99) * 1000:.1f} (n={len(during)}) | {percentile(overall, 0.99) * 1000:.1f} | "
              f"{run.cpu * 100:.1f} | {run.rss / 1e6:.0f} / {run.peak / 1e6:.0f} | "
              f"{run.served_bytes / 1e6:.2f}, {run.served_requests} | {run.series:,} | {run.actors_right} | "
              f"{run.sd_right} | {run.errors:.0f} |")


SECTIONS: dict[str, Callable[[list[int], int, Path | None, float], None]] = {"head": head_section}


def _launcher_section(sizes: list[int], cycles: int, baseline: Path | None, _warmup: float = 0.0) -> None:
    # The launcher's watcher and recorder against a fake fleet of exporters: bench/scale_launcher.py.
    from bench.scale_launcher import launcher_section

    launcher_section(sizes, cycles, baseline)


SECTIONS["launcher"] = _launcher_section


def _prometheus_section(sizes: list[int], _cycles: int, _baseline: Path | None, _warmup: float = 0.0) -> None:
    # A real Prometheus scraping the fake fleet, with and without the cut: bench/prometheus_size.py.
    from bench.prometheus_size import prometheus_section

    prometheus_section(sizes)


SECTIONS["prometheus"] = _prometheus_section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--section", action="append", choices=sorted(SECTIONS), help="default: all")
    parser.add_argument("--sizes", default="10,200,2000", help="node counts, comma-separated")
    parser.add_argument("--cycles", type=int, default=6, help="collections measured per run")
    parser.add_argument("--baseline", type=Path, help="also run this checkout's code, side by side")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds of collections before measuring")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    for section in args.section or list(SECTIONS):
        SECTIONS[section](sizes, args.cycles, args.baseline, args.warmup)


if __name__ == "__main__":
    main()
