"""Reads that cost what they keep: the launcher's families from `/metrics?name[]=...` beside the whole `/metrics`.

One exporter with 8 simulated GPUs (a training node's body) on loopback is read the way the launcher's
health watcher reads it (plain text, gzip, one keep-alive client) four ways, in alternating rounds so
machine noise hits each alike:

    whole      GET /metrics                                  what the watcher reads today
    selected   GET /metrics?name[]=<the watcher's families>  cached: rendered once per change
    304        the same with If-None-Match: its ETag         an unchanged node
    uncached   a set not in the cache (more distinct sets than it holds, in turn): the selection is
               rendered on the request; what each set costs once per change

Server CPU per request is the exporter's CPU over a block of requests, less its background collection
(its rate measured first, with no requests, times the block's duration). The reader's CPU is what the
launcher's watcher spends on one answer (inflate, then its own parse(), which keeps its families). Prints
a markdown table and the ratios against the whole body.

    python -m bench.selection [--requests 2000] [--rounds 3] [--gpus 8]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.scrape import REPO, cpu_seconds, percentile, wait_ready
from exporter.contract import wire
from exporter.serving.exposition import MAX_SELECTIONS
from launcher.health.exporters import FAMILIES as WATCHED
from launcher.health.exporters import parse
from scripts.ports import free_port

HEADERS = {"Accept-Encoding": "gzip"}


@dataclass
class Kind:
    name: str
    paths: list[str]  # requested in turn
    conditional: bool = False  # send If-None-Match with the ETag last seen for the path
    wire_bytes: list[int] = field(default_factory=list)
    inflated_bytes: list[int] = field(default_factory=list)
    statuses: set[int] = field(default_factory=set)
    cpu_per_request: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    last_body: bytes = b""  # gzipped, as it came


async def read(base: str, kind: Kind, requests: int, etags: dict[str, str]) -> tuple[list[float], float]:
    """`requests` sequential reads over one keep-alive connection; per-request seconds and the block's wall."""
    latencies = []
    started_block = time.perf_counter()
    async with aiohttp.ClientSession(base, auto_decompress=False) as session:
        for i in range(requests):
            path = kind.paths[i % len(kind.paths)]
            headers = {**HEADERS, "If-None-Match": etags[path]} if kind.conditional and path in etags else HEADERS
            started = time.perf_counter()
            async with session.get(path, headers=headers) as response:
                body = await response.read()
            latencies.append(time.perf_counter() - started)
            kind.statuses.add(response.status)
            kind.wire_bytes.append(len(body))
            kind.inflated_bytes.append(len(gzip.decompress(body)) if body else 0)
            kind.last_body = body
            etags[path] = response.headers["ETag"]
    return latencies, time.perf_counter() - started_block


def reader_cpu(body: bytes, times: int = 200) -> float:
    """CPU seconds the launcher's watcher spends on one answer: inflate it and keep its families (its own
    parse(), which skips the lines of other families before parsing). Nothing for a 304."""
    if not body:
        return 0.0
    started = time.process_time()
    for _ in range(times):
        parse(gzip.decompress(body).decode())
    return (time.process_time() - started) / times


def uncached_paths(base: str) -> list[str]:
    """More distinct sets than the cache holds, each the watcher's families and one other family the node
    serves: asked in turn, none is still cached when it comes round again."""
    with urllib.request.urlopen(base + wire.METRICS_PATH, timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
        served = [f.name + ("_total" if f.type == "counter" else "") for f in families]
    others = [name for name in served if name not in WATCHED][:2 * MAX_SELECTIONS]
    if len(others) <= MAX_SELECTIONS:
        raise SystemExit(f"only {len(others)} other families served: too few to miss the cache every time")
    return [wire.metrics_path([*WATCHED, other]) for other in others]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests per kind per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--idle-seconds", type=float, default=15.0)
    args = parser.parse_args()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{port}",
                                "--simulate-gpus", str(args.gpus), "--log-level", "warning"], cwd=REPO)
    selected = wire.metrics_path(WATCHED)
    kinds = [Kind("whole /metrics", [wire.METRICS_PATH]), Kind(f"{len(WATCHED)} watched families", [selected]),
             Kind("the same, unchanged: 304", [selected], conditional=True),
             Kind("a set not cached (rendered)", [])]
    try:
        wait_ready(f"{base}/readyz")
        time.sleep(6)  # one full cycle of the 5 s collectors: the body has every family
        kinds[-1].paths = uncached_paths(base)
        etags: dict[str, str] = {}
        for kind in kinds:  # warm: the text format is rendered ahead from now on, as for a launcher reading it
            asyncio.run(read(base, kind, 10, etags))
            kind.wire_bytes.clear()
            kind.inflated_bytes.clear()
        before = cpu_seconds(process.pid)
        time.sleep(args.idle_seconds)
        background = (cpu_seconds(process.pid) - before) / args.idle_seconds  # CPU-s per second
        for _ in range(args.rounds):
            for kind in kinds:
                before = cpu_seconds(process.pid)
                latencies, wall = asyncio.run(read(base, kind, args.requests, etags))
                spent = cpu_seconds(process.pid) - before - background * wall
                kind.cpu_per_request.append(spent / len(latencies))
                kind.latencies.extend(latencies)
        report(kinds, background, args)
    finally:
        process.terminate()
        process.wait(10)


def report(kinds: list[Kind], background: float, args: argparse.Namespace) -> None:
    us = 1e6
    print(f"\n{args.rounds} rounds x {args.requests} requests per kind, text + gzip, one keep-alive client, "
          f"loopback, {args.gpus} simulated GPUs, {os.cpu_count()} CPUs; background collection "
          f"{background * 1000:.1f} ms of CPU per second, subtracted\n")
    print("| request | status | bytes on the wire | bytes inflated | server CPU per request (µs) | p50 (ms) "
          "| reader CPU per answer (µs) |")
    print("|---|---|---|---|---|---|---|")
    readers = [reader_cpu(kind.last_body) for kind in kinds]
    for kind, reader in zip(kinds, readers, strict=True):
        print(f"| {kind.name} | {'/'.join(map(str, sorted(kind.statuses)))} | "
              f"{statistics.mean(kind.wire_bytes):,.0f} | {statistics.mean(kind.inflated_bytes):,.0f} | "
              f"{statistics.mean(kind.cpu_per_request) * us:.0f} | {percentile(kind.latencies, 50) * 1000:.2f} | "
              f"{reader * us:.0f} |")
    whole = kinds[0]
    print()
    for kind, reader in zip(kinds[1:], readers[1:], strict=True):
        wire_ratio = statistics.mean(kind.wire_bytes) / statistics.mean(whole.wire_bytes)
        cpu_ratio = statistics.mean(kind.cpu_per_request) / statistics.mean(whole.cpu_per_request)
        print(f"{kind.name} / whole: bytes on the wire x{wire_ratio:.3f}, server CPU x{cpu_ratio:.2f}, "
              f"reader CPU x{reader / readers[0]:.3f}")


if __name__ == "__main__":
    main()
