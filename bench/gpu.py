"""The GPU collector's cost: CPU time of one collection run over 8 simulated GPUs, and what 8 GPUs'
series do to scrapes, against the same exporter with the GPU collectors off.

1. In process: the `gpu` collector over `SimulatedNvml(8)` (H100s at full load), timed with the
   thread's CPU clock after warm-up runs; the share spent inside the simulator (Python standing in
   for ctypes calls into libnvidia-ml) is measured separately, so the collector's own cost shows.
2. Two exporter processes side by side: `--simulate-gpus 8` and `--disable-collector gpu
   --disable-collector gpu_events`, scraped as Prometheus scrapes (bench/scrape.py's client), in
   alternating rounds; plus each one's background CPU per 5 s collection cycle.

    python -m bench.gpu [--runs 200] [--requests 320] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.scrape import cpu_seconds, free_port, hammer, percentile, series_count, wait_ready

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.collectors.gpu.collector import GpuCollector  # noqa: E402
from exporter.config import load_config  # noqa: E402
from exporter.framework.collector import load_collectors  # noqa: E402
from exporter.framework.snapshot import SampleSink  # noqa: E402
from exporter.gpusim.nvml import SimulatedNvml  # noqa: E402

GPUS = 8
TARGET_MS = 50.0


def _timed(nvml: SimulatedNvml, spent: list[float]) -> None:
    """Wrap every simulated NVML function of `nvml` to add its time to spent[0]."""
    for name, method in inspect.getmembers(nvml, inspect.ismethod):
        if not name.startswith("nvml"):
            continue

        @functools.wraps(method)
        def timed(*args, _method=method, **kwargs):
            started = time.thread_time()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[0] += time.thread_time() - started

        setattr(nvml, name, timed)


def collection_cost(runs: int) -> dict[str, float]:
    load_collectors()
    config = load_config({"gpu": {"simulate": GPUS}}, environ={})
    nvml = SimulatedNvml(GPUS, control_file=None)
    collector = GpuCollector(config, nvml=nvml)
    spent = [0.0]
    _timed(nvml, spent)
    for _ in range(3):  # static reads, NOT_SUPPORTED probing, the first GPM sample
        collector.collect(SampleSink("gpu"))
    cpu, inside, wall, series = [], [], [], 0
    for _ in range(runs):
        sink = SampleSink("gpu")
        spent[0] = 0.0
        started_cpu, started_wall = time.thread_time(), time.perf_counter()
        collector.collect(sink)
        cpu.append(time.thread_time() - started_cpu)
        wall.append(time.perf_counter() - started_wall)
        inside.append(spent[0])
        series = sink.freeze(0).series_count()
        time.sleep(0.02)
    collector.close()
    ms = 1000
    return {"series": series, "cpu_p50": percentile(cpu, 50) * ms, "cpu_p99": percentile(cpu, 99) * ms,
            "cpu_mean": statistics.mean(cpu) * ms, "wall_p50": percentile(wall, 50) * ms,
            "simulator_mean": statistics.mean(inside) * ms,
            "collector_mean": statistics.mean(c - s for c, s in zip(cpu, inside, strict=True)) * ms}


@dataclass
class Exporter:
    name: str
    process: subprocess.Popen
    url: str
    latencies: dict[int, list[float]] = field(default_factory=dict)
    cpu_per_scrape: list[float] = field(default_factory=list)


def start(name: str, *args: str) -> Exporter:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{port}",
                                "--log-level", "warning", *args], cwd=REPO)
    return Exporter(name, process, f"http://127.0.0.1:{port}/metrics")


def idle_cpu_per_cycle(target: Exporter, seconds: float) -> float:
    before = cpu_seconds(target.process.pid)
    time.sleep(seconds)
    return (cpu_seconds(target.process.pid) - before) / (seconds / 5.0)


def scrape_cost(requests: int, rounds: int, idle_seconds: float) -> tuple[list[Exporter], dict[str, float],
                                                                             dict[str, int]]:
    with_gpus = start(f"{GPUS} simulated GPUs", "--simulate-gpus", str(GPUS))
    without = start("GPU collectors off", "--disable-collector", "gpu", "--disable-collector", "gpu_events")
    targets = [with_gpus, without]
    try:
        for target in targets:
            wait_ready(target.url.replace("/metrics", "/readyz"))
        time.sleep(11)  # two GPU runs: GPM's series exist from the second on
        counts = {t.name: series_count(t.url) for t in targets}
        for target in targets:
            asyncio.run(hammer(target.url, 1, 1))  # OpenMetrics is now rendered on every change, as for Prometheus
        idle = {t.name: idle_cpu_per_cycle(t, idle_seconds) for t in targets}
        for _ in range(rounds):
            for concurrency in (1, 32):
                for target in targets:  # side by side, alternating
                    before = cpu_seconds(target.process.pid)
                    latencies = asyncio.run(hammer(target.url, concurrency, requests))
                    target.cpu_per_scrape.append((cpu_seconds(target.process.pid) - before) / len(latencies))
                    target.latencies.setdefault(concurrency, []).extend(latencies)
        return targets, idle, counts
    finally:
        for target in targets:
            target.process.terminate()
            target.process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="collection runs timed in process")
    parser.add_argument("--requests", type=int, default=320, help="scrapes per target per concurrency per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    args = parser.parse_args()

    cost = collection_cost(args.runs)
    print(f"\n## One collection run, {GPUS} simulated H100s, {args.runs} runs, {os.cpu_count()} CPUs\n")
    print("| series | CPU p50 (ms) | CPU p99 (ms) | CPU mean (ms) | of which simulator (ms) | of which collector (ms) "
          "| wall p50 (ms) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {cost['series']} | {cost['cpu_p50']:.1f} | {cost['cpu_p99']:.1f} | {cost['cpu_mean']:.1f} | "
          f"{cost['simulator_mean']:.1f} | {cost['collector_mean']:.1f} | {cost['wall_p50']:.1f} |")
    verdict = "met" if cost["cpu_p99"] < TARGET_MS else "NOT met"
    print(f"\nCPU per run p99 {cost['cpu_p99']:.1f} ms (target < {TARGET_MS:g} ms: {verdict}); "
          f"{cost['cpu_mean'] / GPUS:.2f} ms per GPU")

    targets, idle, counts = scrape_cost(args.requests, args.rounds, args.idle_seconds)
    ms = 1000
    print(f"\n## Scrapes: {args.rounds} rounds x {args.requests} scrapes per target and concurrency, OpenMetrics + "
          f"gzip, loopback\n")
    print("| exporter | series | p50 @1 (ms) | p99 @1 (ms) | p50 @32 (ms) | p99 @32 (ms) | CPU per scrape (ms) "
          "| CPU per 5 s cycle, no scrapes (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for target in targets:
        row = [target.name, str(counts[target.name])]
        for concurrency in (1, 32):
            row += [f"{percentile(target.latencies[concurrency], 50) * ms:.2f}",
                    f"{percentile(target.latencies[concurrency], 99) * ms:.2f}"]
        row += [f"{statistics.mean(target.cpu_per_scrape) * ms:.2f}", f"{idle[target.name] * ms:.1f}"]
        print("| " + " | ".join(row) + " |")
    with_gpus, without = targets
    print()
    for concurrency in (1, 32):
        ratio = percentile(with_gpus.latencies[concurrency], 50) / percentile(without.latencies[concurrency], 50)
        print(f"@{concurrency:>2} clients: p50 with {GPUS} GPUs / p50 without = {ratio:.2f}")
    print(f"series with / without = {counts[with_gpus.name] / counts[without.name]:.2f}")
    print(f"background CPU per cycle with / without = {idle[with_gpus.name] / idle[without.name]:.2f}")


if __name__ == "__main__":
    main()
