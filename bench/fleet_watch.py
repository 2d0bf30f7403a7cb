"""The fleet watch at 2,000 and 10,000 nodes (issue 36): what a health check costs the launcher when
it reads the head's fleet document, beside its peer, the same watcher reading every exporter itself,
with the product's own settings (10 s interval, 3 s read deadline, the head's 2 s per node).

Three processes besides this one, each measured on its own:
- the fleet (bench/scale_launcher.py `fleet`): N exporters on N loopback addresses, each serving a real
  8-GPU node's /metrics (8 ranks training) and the digest the exporter's own code makes of it;
- the head: the production exporter (exporter.serving.server.Exporter, no collectors) whose /sd slot
  holds the fleet's targets, as the ray_head collector would fill it from Ray's GCS; it gathers every
  node's digest and serves /health/fleet. Its CPU (utime + stime) and its /healthz latency, asked
  every 100 ms from this process, are measured while the launcher checks;
- the launcher: the production Watcher with the policy's defaults, a check every 10 s while every node
  advances a step a second; one node gets an XID 79 before the third check; then every rank stops and
  the checks go on until the hang is judged (threshold 30 s: three checks, the least the policy allows).

With `--prometheus`, the same watcher reads its signals from a real Prometheus instead
(`health.source: prometheus`, launcher/health/promql.py): the binary scrapes every node the fleet's /sd
lists (only the digest's families, `name[]`, every PROMETHEUS_SCRAPE), and the launcher asks it one query
per rule; Prometheus's own CPU is measured beside the launcher's.

    python -m bench.fleet_watch [--sizes 2000,10000] [--checks 6] [--no-direct] [--no-head] [--prometheus]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.scale_launcher import _get, _post, _wait, capture, fleet

REPO = Path(__file__).resolve().parent.parent
FAULT_BEFORE_CHECK = 3
FLOOR_S = 15.0
HANG_AFTER_S = 30.0  # three checks of 10 s: the least HealthPolicy allows (MIN_CHECKS_PER_THRESHOLD)
PROMETHEUS_SCRAPE = "10s"  # the check interval: a fault is in Prometheus within one check


# --- the head ---------------------------------------------------------------------------------------------


def serve_head(sd: str, port: int) -> None:
    import asyncio

    from exporter.config import load_config
    from exporter.framework.shared import ServiceDiscovery, Shared
    from exporter.serving.server import Exporter

    async def main() -> None:
        config = load_config({"listen": f"127.0.0.1:{port}", "progress": {"listen": "off"}}, environ={})
        shared = Shared.for_config(config)
        groups = tuple(json.loads(_get(sd, 60)))
        shared.service_discovery.publish(ServiceDiscovery("head", groups))
        exporter = Exporter(config, collectors=[], shared=shared)
        await exporter.start()
        print(json.dumps({"url": f"http://127.0.0.1:{exporter.port}", "pid": os.getpid()}), flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await exporter.stop()

    asyncio.run(main())


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Pinger:
    """/healthz of the head every 100 ms, each answer's latency kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            began = time.monotonic()
            try:
                _get(self.url + "/healthz", 5)
            except OSError:
                continue
            self.latencies.append(time.monotonic() - began)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(10)
        ordered = sorted(self.latencies)
        p99 = ordered[int(0.99 * (len(ordered) - 1))] if ordered else float("nan")
        return {"healthz_p50_ms": round(statistics.median(ordered) * 1000, 1) if ordered else float("nan"),
                "healthz_p99_ms": round(p99 * 1000, 1), "healthz_asks": len(ordered)}


# --- the launcher ------------------------------------------------------------------------------------------


def measure(head: str | None, sd: str, control: str, began: float, checks: int, fault_node: int,
            hang: bool, progress_at: float, prometheus: str | None = None) -> dict[str, Any]:
    """The production watcher, its defaults; `head` None: it reads every exporter itself (the peer);
    `prometheus`: it asks that Prometheus first (health.source: prometheus)."""
    from launcher.health.exporters import from_sd
    from launcher.health.faults import Attempt
    from launcher.health.fleet import FleetReader
    from launcher.health.policy import FaultClass, HealthPolicy
    from launcher.health.promql import PromqlReader
    from launcher.health.watcher import Watcher

    policy = HealthPolicy(hang_after_seconds=HANG_AFTER_S)
    reader = FleetReader(lambda: head, lambda: None) if head else None
    watcher = Watcher(policy, from_sd(sd), fleet=reader, promql=PromqlReader(prometheus) if prometheus else None)
    watcher.watch(Attempt(1, "scale-a1", started_at=began, running_at=began))
    ticking = threading.Event()
    ticking.set()

    def tick() -> None:  # every node advances a step a second, its report time with it
        while True:
            if ticking.is_set():
                _post(f"{control}/fake/tick?generation={int(time.time() - progress_at)}")
            time.sleep(1.0)

    threading.Thread(target=tick, daemon=True).start()
    rows: list[dict[str, Any]] = []
    injected = stopped = None
    seen_fault = hang_at = None
    number = 0
    while True:
        number += 1
        if number == FAULT_BEFORE_CHECK:
            _post(f"{control}/fake/fault?node={fault_node}")
            injected = time.time()
        if hang and stopped is None and number == checks + 1:
            ticking.clear()
            stopped = time.time()
        wall, cpu = time.monotonic(), time.process_time()
        check = watcher.check()
        row = {"check": number, "wall": round(time.monotonic() - wall, 3), "cpu": round(time.process_time() - cpu, 3),
               "listed": len(check.reads), "judged": sum(1 for read in check.reads if read.ok),
               "source": check.source, "why_not": watcher.promql.why_not if watcher.promql else None,
               "faults": [fault.summary for fault in check.faults],
               "errors": sorted({read.error for read in check.reads if read.error})[:3]}
        rows.append(row)
        for fault in check.faults:
            if fault.kind is FaultClass.GPU_FAULT and seen_fault is None:
                seen_fault = round(time.time() - injected, 1) if injected else 0.0
            if fault.kind is FaultClass.HANG:
                hang_at = round(time.time() - stopped, 1) if stopped else None
        print(json.dumps(row), file=sys.stderr, flush=True)
        if number >= checks and (not hang or hang_at is not None or number > checks + 8):
            break
        time.sleep(max(0.0, policy.check_interval_seconds - (time.monotonic() - wall)))
    training = [row for row in rows if row["check"] > 1 and row["check"] <= checks]
    return {"checks": rows, "cpu_p50": statistics.median(row["cpu"] for row in training),
            "cpu_max": max(row["cpu"] for row in training), "wall_p50": statistics.median(r["wall"] for r in training),
            "wall_max": max(row["wall"] for row in training),
            "judged_min": min(row["judged"] for row in training), "listed": rows[-1]["listed"],
            "sources": sorted({row["source"] for row in rows}),
            "fault_seen_after_s": seen_fault, "hang_after_stop_s": hang_at,
            "rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def run_measure(head: str | None, fake: Any, began: float, checks: int, fault_node: int, hang: bool,
                progress_at: float, prometheus: str | None = None) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.fleet_watch", "measure", "--sd", fake.sd, "--control", fake.control,
               "--began", str(began), "--checks", str(checks), "--fault-node", str(fault_node),
               "--progress-at", str(progress_at), *(["--head", head] if head else []), *(["--hang"] if hang else []),
               *(["--prometheus", prometheus] if prometheus else [])]
    result = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, text=True, timeout=3600)  # rows: stderr
    if result.returncode != 0:
        raise SystemExit("measure failed (its stderr is above)")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _progress_time(healthy: Path) -> float:
    """When the captured body's ranks last reported (the fleet's ticks count seconds from it)."""
    for line in healthy.read_text().splitlines():
        if line.startswith("raypulse_train_last_progress_time_seconds{"):
            return float(line.rsplit(" ", 1)[1])
    raise SystemExit("the captured body has no progress time")


@contextmanager
def scraping(sd: str, nodes: int, directory: Path) -> Iterator[tuple[str, int]]:
    """A real Prometheus that scrapes the digest's families of every node /sd lists; its URL and pid once it
    has every node up."""
    from alerts.prometheus import config, render
    from exporter.contract import digest
    from launcher.promql import Prometheus
    from scripts.ports import free_port

    document = config(sd_url=sd, scrape_interval=PROMETHEUS_SCRAPE, rules=[], ray_metrics=False, rollout_metrics=False)
    document["scrape_configs"][0]["params"] = {"name[]": list(digest.FAMILIES)}
    (directory / "prometheus.yml").write_text(render(document))
    port = free_port()
    process = subprocess.Popen(["prometheus", f"--config.file={directory / 'prometheus.yml'}",
                                f"--storage.tsdb.path={directory / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                                "--log.level=warn"], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        client = Prometheus(url)
        _wait(lambda: sum(sample.value[1] for sample in client.query("count(up == 1)")) >= nodes, 300,
              "Prometheus to scrape every node")
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(60)


def bench(sizes: list[int], checks: int, direct: bool, head_path: bool = True, prometheus: bool = False) -> None:
    from scripts.ports import free_port

    rows = []
    with tempfile.TemporaryDirectory(prefix="raypulse-fleet-") as directory:
        print("fleet_watch: capturing a real 8-GPU exporter's bodies ...", file=sys.stderr, flush=True)
        healthy, faulty, began = capture(Path(directory))
        progress_at = _progress_time(healthy)
        for nodes in sizes:
            fault_node = nodes // 2
            if prometheus:
                with fleet(nodes, healthy, faulty, []) as fake, \
                        tempfile.TemporaryDirectory(prefix="raypulse-prom-") as stored:
                    _wait(lambda: len(json.loads(_get(fake.sd, 60))) == nodes, 120, "the fleet's /sd")  # noqa: B023
                    print(f"fleet_watch: {nodes} nodes through Prometheus ...", file=sys.stderr, flush=True)
                    with scraping(fake.sd, nodes, Path(stored)) as (url, pid):
                        cpu, wall = _cpu_seconds(pid), time.monotonic()
                        result = run_measure(None, fake, began, checks, fault_node, True, progress_at, url)
                        result["prometheus_cpu_share"] = round((_cpu_seconds(pid) - cpu) / (time.monotonic() - wall),
                                                               3)
                    rows.append((nodes, f"Prometheus (scrape every {PROMETHEUS_SCRAPE})", result))
            if not head_path:
                continue
            with fleet(nodes, healthy, faulty, []) as fake:
                _wait(lambda: len(json.loads(_get(fake.sd, 60))) == nodes, 120, "the fleet's /sd")  # noqa: B023
                head = subprocess.Popen([sys.executable, "-m", "bench.fleet_watch", "head", "--sd", fake.sd,
                                         "--port", str(free_port())], cwd=REPO, stdout=subprocess.PIPE, text=True)
                try:
                    assert head.stdout is not None
                    started = json.loads(head.stdout.readline())
                    print(f"fleet_watch: {nodes} nodes through the head ...", file=sys.stderr, flush=True)
                    floor = Pinger(started["url"])  # before any ask: the head idle, this machine's noise
                    time.sleep(FLOOR_S)
                    idle = floor.stop()
                    pinger, cpu, wall = Pinger(started["url"]), _cpu_seconds(started["pid"]), time.monotonic()
                    result = run_measure(started["url"], fake, began, checks, fault_node, True, progress_at)
                    used = _cpu_seconds(started["pid"]) - cpu
                    result["head_cpu_share"] = round(used / (time.monotonic() - wall), 3)
                    result.update(pinger.stop())
                    result["floor_p99_ms"] = idle["healthz_p99_ms"]
                    rows.append((nodes, "head's document", result))
                finally:
                    head.terminate()
                    head.wait(30)
            if direct:
                with fleet(nodes, healthy, faulty, []) as fake:
                    _wait(lambda: len(json.loads(_get(fake.sd, 60))) == nodes, 120, "the fleet's /sd")  # noqa: B023
                    print(f"fleet_watch: {nodes} nodes, every exporter read directly ...", file=sys.stderr, flush=True)
                    rows.append((nodes, "direct reads (peer)",
                                 run_measure(None, fake, began, checks, fault_node, False, progress_at)))
    print_table(rows)


def print_table(rows: list[tuple[int, str, dict[str, Any]]]) -> None:
    from exporter.serving import fleet as gatherer

    print("\n### The fleet watch (python -m bench.fleet_watch)\n")
    print(f"Measured on {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          "the product's settings (a check every 10 s, 3 s read deadline; the head: "
          f"{gatherer.READ_TIMEOUT_S:g} s per node, {gatherer.MAX_PARALLEL} reads at once). Every node advances a "
          "step a second; an XID 79 on one node before the third check; then "
          f"every rank stops (hang threshold {HANG_AFTER_S:g} s). Launcher CPU-s and wall s per training check "
          "(p50 / max), the launcher's peak RSS; the head's CPU as a share of one core and its /healthz latency "
          "while the launcher checks (floor: the same head's p99 before anyone asked, this machine's noise).\n")
    print("| nodes | read | launcher CPU-s / check | check wall s | nodes judged (min) / listed | XID seen after | "
          "hang judged after the stop | launcher RSS MB | head (or Prometheus) CPU | head /healthz p50 / p99 ms "
          "(floor p99) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for nodes, name, result in rows:
        head = f"{result['head_cpu_share']:.0%}" if "head_cpu_share" in result else \
            f"({result['prometheus_cpu_share']:.0%})" if "prometheus_cpu_share" in result else "-"
        healthz = f"{result['healthz_p50_ms']} / {result['healthz_p99_ms']} ({result['floor_p99_ms']})" \
            if "healthz_p99_ms" in result else "-"
        seen = f"{result['fault_seen_after_s']} s" if result["fault_seen_after_s"] is not None else "never"
        hang = f"{result['hang_after_stop_s']} s" if result["hang_after_stop_s"] is not None else "-"
        print(f"| {nodes:,} | {name} | {result['cpu_p50']:.2f} / {result['cpu_max']:.2f} | "
              f"{result['wall_p50']:.2f} / {result['wall_max']:.2f} | {result['judged_min']:,} / {result['listed']:,} "
              f"| {seen} | {hang} | {result['rss_mb']:.0f} | {head} | {healthz} |")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    head = sub.add_parser("head")
    head.add_argument("--sd", required=True)
    head.add_argument("--port", type=int, required=True)
    run = sub.add_parser("measure")
    run.add_argument("--head")
    run.add_argument("--sd", required=True)
    run.add_argument("--control", required=True)
    run.add_argument("--began", type=float, required=True)
    run.add_argument("--checks", type=int, required=True)
    run.add_argument("--fault-node", type=int, required=True)
    run.add_argument("--progress-at", type=float, required=True)
    run.add_argument("--hang", action="store_true")
    run.add_argument("--prometheus")
    parser.add_argument("--sizes", default="2000,10000")
    parser.add_argument("--checks", type=int, default=6)
    parser.add_argument("--no-direct", action="store_true")
    parser.add_argument("--no-head", action="store_true")
    parser.add_argument("--prometheus", action="store_true", help="also through a real Prometheus (the binary)")
    args = parser.parse_args()
    if args.command == "head":
        serve_head(args.sd, args.port)
    elif args.command == "measure":
        print(json.dumps(measure(args.head, args.sd, args.control, args.began, args.checks, args.fault_node,
                                 args.hang, args.progress_at, args.prometheus)))
    else:
        bench([int(size) for size in args.sizes.split(",")], args.checks, not args.no_direct, not args.no_head,
              args.prometheus)


if __name__ == "__main__":
    main()
