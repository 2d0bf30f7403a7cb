"""Scrape latency, series count, memory and CPU: raypulse's exporter beside prometheus-node-exporter.

Both run on loopback in the same run and are scraped the way Prometheus scrapes (OpenMetrics
Accept header, gzip, keep-alive), by 1 and then 32 concurrent clients, in alternating rounds so
machine noise hits both alike. Prints a markdown table and the ratios.

    python -m bench.scrape [--requests 400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from scripts.ports import free_port

REPO = Path(__file__).resolve().parent.parent
ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
          "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def rss_bytes(pid: int, key: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def wait_ready(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not become ready")


def series_count(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as response:
        return sum(1 for line in response.read().decode().splitlines() if line and not line.startswith("#"))


@dataclass
class Target:
    name: str
    process: subprocess.Popen
    url: str
    latencies: dict[int, list[float]] = field(default_factory=dict)
    cpu_per_scrape: list[float] = field(default_factory=list)


async def hammer(url: str, concurrency: int, requests: int) -> list[float]:
    """`requests` scrapes spread over `concurrency` keep-alive clients; per-request seconds."""
    latencies: list[float] = []
    per_client = requests // concurrency
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"Accept": ACCEPT, "Accept-Encoding": "gzip"}
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        async def client() -> None:
            for _ in range(per_client):
                started = time.perf_counter()
                async with session.get(url, headers=headers) as response:
                    await response.read()
                    assert response.status == 200, response.status
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def start_targets() -> tuple[Target, Target]:
    node_exporter = shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter"
    if not Path(node_exporter).exists():
        raise SystemExit("prometheus-node-exporter is not installed (apt-get install -y prometheus-node-exporter)")
    ours_port, theirs_port = free_port(), free_port()
    ours = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{ours_port}",
                             "--log-level", "warning"], cwd=REPO)
    # Its default collectors, less systemd, which only fails (no D-Bus) on a machine without systemd.
    theirs = subprocess.Popen([node_exporter, f"--web.listen-address=127.0.0.1:{theirs_port}", "--log.level=error",
                               "--no-collector.systemd"], stderr=subprocess.DEVNULL)
    return (Target("raypulse exporter", ours, f"http://127.0.0.1:{ours_port}/metrics"),
            Target("node_exporter", theirs, f"http://127.0.0.1:{theirs_port}/metrics"))


def idle_cpu_per_cycle(target: Target, seconds: float, cycle: float = 5.0) -> float:
    """CPU our exporter spends on background collection, per `cycle` seconds (no scrapes)."""
    before = cpu_seconds(target.process.pid)
    time.sleep(seconds)
    return (cpu_seconds(target.process.pid) - before) / (seconds / cycle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=320, help="scrapes per target per concurrency per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    args = parser.parse_args()

    ours, theirs = start_targets()
    try:
        for target in (ours, theirs):
            wait_ready(target.url)
        wait_ready(ours.url.replace("/metrics", "/readyz"))
        time.sleep(6)  # one full cycle of the 5 s collectors, so the series count is settled
        counts = {t.name: series_count(t.url) for t in (ours, theirs)}
        asyncio.run(hammer(ours.url, 1, 1))  # as Prometheus would: OpenMetrics is now rendered on every change
        idle_cpu = idle_cpu_per_cycle(ours, args.idle_seconds)

        for _ in range(args.rounds):
            for concurrency in (1, 32):
                for target in (ours, theirs):  # side by side, alternating
                    before = cpu_seconds(target.process.pid)
                    latencies = asyncio.run(hammer(target.url, concurrency, args.requests))
                    target.cpu_per_scrape.append((cpu_seconds(target.process.pid) - before) / len(latencies))
                    target.latencies.setdefault(concurrency, []).extend(latencies)
        rss, peak = rss_bytes(ours.process.pid), rss_bytes(ours.process.pid, "VmHWM")
        report(ours, theirs, counts, rss, peak, idle_cpu, args)
    finally:
        for target in (ours, theirs):
            target.process.terminate()
            target.process.wait(10)


def report(ours: Target, theirs: Target, counts: dict[str, int], rss: int, peak: int, idle_cpu: float,
           args: argparse.Namespace) -> None:
    ms = 1000
    print(f"\n{args.rounds} rounds x {args.requests} scrapes per target and concurrency, OpenMetrics + gzip, "
          f"loopback, {os.cpu_count()} CPUs\n")
    print("| target | series | p50 @1 (ms) | p99 @1 (ms) | p50 @32 (ms) | p99 @32 (ms) | CPU per scrape (ms) |")
    print("|---|---|---|---|---|---|---|")
    for target in (ours, theirs):
        row = [target.name, str(counts[target.name])]
        for concurrency in (1, 32):
            row += [f"{percentile(target.latencies[concurrency], 50) * ms:.2f}",
                    f"{percentile(target.latencies[concurrency], 99) * ms:.2f}"]
        row.append(f"{statistics.mean(target.cpu_per_scrape) * ms:.2f}")
        print("| " + " | ".join(row) + " |")
    print()
    for concurrency in (1, 32):
        ours_p99 = percentile(ours.latencies[concurrency], 99)
        theirs_p50 = percentile(theirs.latencies[concurrency], 50)
        verdict = "met" if ours_p99 < theirs_p50 else "NOT met"
        print(f"@{concurrency:>2} clients: our p99 / node_exporter p50 = {ours_p99 / theirs_p50:.2f} "
              f"(target < 1: {verdict})")
    print(f"our series / node_exporter series = {counts[ours.name] / counts[theirs.name]:.2f}")
    print(f"our RSS after the run: {rss / 2**20:.1f} MiB (peak {peak / 2**20:.1f} MiB; target < 80 MB: "
          f"{'met' if peak < 80e6 else 'NOT met'})")
    print(f"our CPU per 5 s collection cycle (collect + render), no scrapes: {idle_cpu * ms:.1f} ms "
          f"({idle_cpu / 5 * 100:.2f}% of one CPU)")


if __name__ == "__main__":
    main()
