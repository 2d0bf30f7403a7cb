"""Prometheus at cluster scale (issue 26): a real Prometheus (the system's `prometheus`, Debian's 2.42)
scraping the fake fleet of bench/scale_launcher.py (N node exporters on N loopback addresses, each
serving a real `exporter serve --simulate-gpus 8` body with eight ranks reporting progress), configured
by the same builder as `launcher prometheus-config` (alerts/prometheus.py, dashboards/cut.py), with and
without the cut, at each size.

Per run: Prometheus starts empty, scrapes every `--interval` for `--warmup` seconds, then for `--measure`
seconds: head series (prometheus_tsdb_head_series), samples appended per second (the rate of
prometheus_tsdb_head_samples_appended_total over the window), RSS (VmRSS of the process; peak VmHWM)
and Go heap in use. Bytes per series are the slope between the smallest and the largest size (what one
more node costs, without the fixed cost of an empty Prometheus).

    python -m bench.scale --section prometheus [--sizes 50,200]
    python -m bench.prometheus_size [--sizes 50,200] [--interval 15] [--warmup 75] [--measure 60] [--rules]

Caveats, said where the numbers are used (docs/scale.md): the fleet's values change only when a test
ticks it, so chunks compress better than a real node's (gauges that move every scrape); a short run
holds under one chunk per series (a full head holds up to two hours). The per-series cost measured here is
the head's index and series overhead, a floor for the steady state.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from alerts import prometheus
from bench.scale_launcher import capture, fleet
from dashboards import cut as cutting
from scripts.ports import free_port

NODES_AT_SCALE = 2000
SHARDS = (1, 2, 4, 8)
# The plan: issue 26's ~3.25 KB per series (the same Prometheus, a longer run) where this short run
# measures less, doubled for two hours of head chunks, GC headroom, queries and compaction.
PLAN_KB_FLOOR = 3.25
PLAN_FACTOR = 2.0


@dataclass
class Run:
    nodes: int
    cut: bool
    series: int
    samples_per_s: float
    rss_mb: float
    peak_mb: float
    heap_mb: float
    scrape_seconds_max: float  # the slowest target's last scrape


def _get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _query(base: str, expr: str) -> float:
    body = json.loads(_get(f"{base}/api/v1/query?query={urllib.parse.quote(expr)}"))
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def _own(base: str, name: str) -> float:
    """One of Prometheus's own metrics, read from its /metrics (this config does not scrape it)."""
    values = [float(sample.value) for family in text_string_to_metric_families(_get(f"{base}/metrics").decode())
              for sample in family.samples if sample.name == name]  # summed over labels such as `type`
    return sum(values) if values else float("nan")


def _status_kb(pid: int, field: str) -> float:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return float(match.group(1)) if match else float("nan")


def config_for(sd_url: str, interval: str, cut: bool, rules: bool) -> dict[str, Any]:
    document = prometheus.config(sd_url=sd_url, scrape_interval=interval, rules=None if rules else [])
    if cut:
        for job in document["scrape_configs"]:
            job["metric_relabel_configs"] = cutting.relabel_configs(cutting.derive())
    return document


def measure_one(sd_url: str, nodes: int, cut: bool, interval: float, warmup: float, window: float,
                rules: bool, binary: str) -> Run:
    with tempfile.TemporaryDirectory(prefix="raypulse-promsize-") as tmp:
        path = Path(tmp) / "prometheus.yml"
        path.write_text(prometheus.render(config_for(sd_url, f"{interval:g}s", cut, rules)))
        port = free_port()
        process = subprocess.Popen([binary, f"--config.file={path}", f"--storage.tsdb.path={tmp}/data",
                                    f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            time.sleep(warmup)
            up = _query(base, "count(up == 1)")
            if up != nodes:
                raise SystemExit(f"{nodes} nodes: only {up:.0f} targets up after {warmup:.0f}s; give more --warmup")
            appended_before = _own(base, "prometheus_tsdb_head_samples_appended_total")
            started = time.monotonic()
            time.sleep(window)
            appended = _own(base, "prometheus_tsdb_head_samples_appended_total") - appended_before
            elapsed = time.monotonic() - started
            return Run(nodes=nodes, cut=cut, series=int(_own(base, "prometheus_tsdb_head_series")),
                       samples_per_s=appended / elapsed, rss_mb=_status_kb(process.pid, "VmRSS") / 1024,
                       peak_mb=_status_kb(process.pid, "VmHWM") / 1024,
                       heap_mb=_own(base, "go_memstats_heap_inuse_bytes") / 2**20,
                       scrape_seconds_max=_query(base, "max(scrape_duration_seconds)"))
        finally:
            process.terminate()
            process.wait(60)


def prometheus_section(sizes: list[int], interval: float = 15.0, warmup: float = 75.0, window: float = 60.0,
                       rules: bool = False) -> list[Run]:
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is not installed (apt-get install prometheus): the section measures a real one")
    runs = []
    with tempfile.TemporaryDirectory(prefix="raypulse-promsize-bodies-") as tmp:
        healthy, _faulty, _ = capture(Path(tmp))
        for nodes in sizes:
            with fleet(nodes, healthy, healthy, []) as served:
                for cut in (False, True):
                    run = measure_one(served.sd, nodes, cut, interval, warmup, window, rules, binary)
                    print(json.dumps(asdict(run)), flush=True)
                    runs.append(run)
    print_table(runs, interval)
    return runs


def per_series_kb(runs: list[Run], cut: bool) -> float:
    """RSS per series: the slope between the smallest and the largest size."""
    chosen = sorted((run for run in runs if run.cut == cut), key=lambda run: run.nodes)
    if len(chosen) < 2 or chosen[-1].series == chosen[0].series:
        return chosen[-1].rss_mb * 1024 / chosen[-1].series if chosen else float("nan")
    return (chosen[-1].rss_mb - chosen[0].rss_mb) * 1024 / (chosen[-1].series - chosen[0].series)


def print_table(runs: list[Run], interval: float) -> None:
    print(f"\n### Prometheus vs cluster size (bench.scale --section prometheus; scrape every {interval:g} s)\n")
    print("| nodes | cut | head series | series / node | samples/s | RSS (MB) | peak RSS (MB) | Go heap in use (MB) "
          "| slowest scrape (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        print(f"| {run.nodes:,} | {'yes' if run.cut else 'no'} | {run.series:,} | {run.series / run.nodes:,.0f} | "
              f"{run.samples_per_s:,.0f} | {run.rss_mb:,.0f} | {run.peak_mb:,.0f} | {run.heap_mb:,.0f} | "
              f"{run.scrape_seconds_max:.3f} |")
    print(f"\n### Sizing at {NODES_AT_SCALE:,} nodes (RSS per series: the slope between sizes; planned: "
          f"{PLAN_FACTOR:g} x the larger of that and {PLAN_KB_FLOOR:g} KB)\n")
    print("| cut | shards | series per shard | samples/s per shard | RSS per series measured (KB) | "
          "RSS per shard measured (GB) | memory per shard planned (GB) |")
    print("|---|---|---|---|---|---|---|")
    for cut in (False, True):
        chosen = [run for run in runs if run.cut == cut]
        if not chosen:
            continue
        largest = max(chosen, key=lambda run: run.nodes)
        kb = per_series_kb(runs, cut)
        for shards in SHARDS:
            series = largest.series / largest.nodes * NODES_AT_SCALE / shards
            print(f"| {'yes' if cut else 'no'} | {shards} | {series:,.0f} | {series / interval:,.0f} | {kb:.2f} | "
                  f"{series * kb / 2**20:.1f} | {series * PLAN_FACTOR * max(kb, PLAN_KB_FLOOR) / 2**20:.0f} |")

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="50,200", help="node counts, comma-separated")
    parser.add_argument("--interval", type=float, default=15.0, help="scrape interval, seconds")
    parser.add_argument("--warmup", type=float, default=75.0, help="seconds of scrapes before measuring")
    parser.add_argument("--measure", type=float, default=60.0, help="seconds the samples rate is taken over")
    parser.add_argument("--rules", action="store_true", help="also evaluate raypulse's rule files")
    args = parser.parse_args()
    prometheus_section([int(size) for size in args.sizes.split(",")], args.interval, args.warmup, args.measure,
                       args.rules)


if __name__ == "__main__":
    main()
