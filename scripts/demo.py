"""`make demo`: start the exporter, let a real Prometheus scrape it, and show what it sees.

Until the launcher lands this is the main job end to end: exporter up, scraped, queried, torn
down. `--keep` leaves the exporter (and Prometheus) running for a look in the browser.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
console = Console()


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise RuntimeError("no free port")


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"demo: timed out waiting for {what}")


def query(prometheus: str, promql: str) -> list[dict]:
    body = get(f"{prometheus}/api/v1/query?query={urllib.parse.quote(promql)}")
    return json.loads(body)["data"]["result"]


QUERIES = [
    ("CPU busy (all CPUs)", 'sum by (instance) (rate(raypulse_node_cpu_seconds_total{mode!~"idle|iowait"}[15s])) '
                            '/ on(instance) raypulse_node_cpus', "percent"),
    ("memory available", "raypulse_node_memory_available_bytes / raypulse_node_memory_total_bytes", "percent"),
    ("checkpoint volume free", 'raypulse_node_filesystem_avail_bytes * on(mountpoint) group_left '
                               'raypulse_node_filesystem_path_info{role="checkpoint"}', "bytes"),
    ("object store (/dev/shm) used", '1 - raypulse_node_filesystem_avail_bytes{mountpoint="/dev/shm"} '
                                     '/ raypulse_node_filesystem_size_bytes{mountpoint="/dev/shm"}', "percent"),
    ("pod working set", "raypulse_pod_memory_working_set_bytes", "bytes"),
    ("collectors up", "sum(raypulse_exporter_collector_up) / count(raypulse_exporter_collector_up)", "percent"),
    ("exporter resident memory", "raypulse_exporter_resident_memory_bytes", "bytes"),
]


def formatted(value: float, unit: str) -> str:
    if unit == "percent":
        return f"{value * 100:.1f} %"
    return f"{value / 2**30:.2f} GiB" if value > 2**30 else f"{value / 2**20:.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the exporter and Prometheus running")
    args = parser.parse_args()
    workdir = REPO / ".demo"
    checkpoints = workdir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    processes: list[subprocess.Popen] = []
    try:
        port = free_port(9477)
        exporter_url = f"http://127.0.0.1:{port}"
        console.rule("[bold]raypulse exporter")
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{port}", "--checkpoint-path",
             str(checkpoints)], cwd=REPO, stdout=(workdir / "exporter.log").open("wb"), stderr=subprocess.STDOUT))
        wait(lambda: get(f"{exporter_url}/readyz") == b"ready\n", 30, "the exporter")
        time.sleep(1)
        text = get(f"{exporter_url}/metrics").decode()
        series = [line for line in text.splitlines() if line and not line.startswith("#")]
        families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
        console.print(f"{exporter_url}/metrics serves [bold]{len(series)}[/] series in [bold]{len(families)}[/] "
                      f"families (log: .demo/exporter.log). A few of them:")
        for prefix in ("raypulse_node_load1 ", "raypulse_node_memory_available_bytes ",
                       'raypulse_node_filesystem_path_info{', "raypulse_pod_info{",
                       'raypulse_exporter_collector_up{collector="filesystem"}'):
            for line in series:
                if line.startswith(prefix):
                    console.print(f"  [dim]{line}[/]", soft_wrap=True)

        prometheus_bin = shutil.which("prometheus")
        if prometheus_bin is None:
            console.print("[yellow]prometheus is not installed (make system-deps); skipping the Prometheus part")
            return
        console.rule("[bold]Prometheus scraping it")
        prom_port = free_port(9090)
        prometheus = f"http://127.0.0.1:{prom_port}"
        config = workdir / "prometheus.yml"
        config.write_text(f"global: {{scrape_interval: 2s}}\nscrape_configs:\n  - job_name: raypulse\n"
                          f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")
        processes.append(subprocess.Popen(
            [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tempfile.mkdtemp(dir=workdir)}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=(workdir / "prometheus.log").open("wb"), stderr=subprocess.STDOUT))
        # Collectors refresh every 5 s; wait until Prometheus has seen a counter move.
        wait(lambda: bool(query(prometheus, 'changes(raypulse_node_cpu_seconds_total{mode="user"}[1m]) > 0')), 60,
             "two collections")
        target = json.loads(get(f"{prometheus}/api/v1/targets"))["data"]["activeTargets"][0]
        console.print(f"target {target['scrapeUrl']}: health [bold]{target['health']}[/], "
                      f"last scrape {target['lastScrapeDuration'] * 1000:.1f} ms")
        table = Table("what", "value", "PromQL")
        for title, promql, unit in QUERIES:
            result = query(prometheus, promql)
            value = formatted(float(result[0]["value"][1]), unit) if result else "[red]no data"
            table.add_row(title, value, f"[dim]{promql}[/]")
        console.print(table)
        if args.keep:
            console.print(f"exporter {exporter_url}  Prometheus {prometheus}  (Ctrl-C to stop)")
            processes[-1].wait()
    except KeyboardInterrupt:
        pass
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(10)
        console.print("[green]demo done[/]: exporter and Prometheus stopped")


if __name__ == "__main__":
    main()
