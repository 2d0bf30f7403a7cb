"""`make demo`: one small training job, end to end, through `launcher submit`.

The launcher starts a local Ray cluster (a head, two workers with one simulated GPU each, one
exporter per node), runs examples/train.py on it (two data-parallel ranks that report their
progress to their node's exporter), streams the job's output and tears everything down. While it
runs, this script shows what the exporters see (steps, loss, throughput, GPUs) and, when
Prometheus and Alertmanager are installed, runs them with raypulse's alert rules on the head
exporter's service discovery and queries them. At the end it checks that nothing is left running.

    python -m scripts.demo [--steps 120] [--keep]    # --keep: leave it all up until Ctrl-C
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from exporter.contract import wire
from scripts.ports import port_free

REPO = Path(__file__).resolve().parent.parent
WORKDIR = REPO / ".demo"
# Wide enough for the tables when the output is not a terminal (rich assumes 80 columns there).
console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 120)


def port_base(preferred: int, count: int) -> int:
    """`preferred` (the launcher's default) when its ports are free, else a free range."""
    for base in (preferred, *range(30000, 60000, 97)):
        if all(port_free(port) for port in range(base, base + count)):
            return base
    raise SystemExit("demo: no free ports")


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """{family sample name: [(labels, value)]} of one exporter, or {} while it is not up."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=3) as response:
            text = response.read().decode()
    except OSError:
        return {}
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def answers(url: str) -> bool:
    """The head exporter serves /sd, so Prometheus can start on it."""
    try:
        with urllib.request.urlopen(url + wire.SD_PATH, timeout=2) as response:
            return response.status == 200 and bool(json.loads(response.read()))
    except (OSError, ValueError):
        return False


def echo(stream, style: str) -> None:
    for line in stream:
        console.print(line.rstrip("\n"), style=style or None, markup=False, soft_wrap=True)


def cluster_record(home: Path, run_id: str) -> dict | None:
    try:
        record = json.loads((home / "clusters" / run_id / "cluster.json").read_text())
    except (OSError, ValueError):
        return None
    return record if any(exporter["node"] != "head" for exporter in record["exporters"]) else None


def _of(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, rank: str | None) -> str:
    values = [value for labels, value in samples.get(name, []) if labels.get("rank") == rank]
    return f"{values[0]:.4g}" if values else "-"


def progress_table(exporters: list[dict]) -> Table | None:
    """One row per rank that reports progress, plus each worker's simulated GPUs."""
    table = Table("node", "rank", "step", "loss", "samples", "checkpoint at", "GPU util", "GPU power",
                  title="what the exporters see", title_justify="left")
    rows = 0
    scraped = [(exporter, scrape(exporter["url"])) for exporter in exporters]
    # The driver (on the head) saves the checkpoints and reports them to the head's exporter.
    checkpoints = {labels.get("rank"): value for _, samples in scraped
                   for labels, value in samples.get("raypulse_train_checkpoint_step", [])}
    for exporter, samples in scraped:
        gpus = samples.get("raypulse_gpu_utilization_ratio", [])
        power = samples.get("raypulse_gpu_power_usage_watts", [])
        gpu_util = ", ".join(f"{value:.0%}" for _, value in gpus) or "-"
        gpu_power = ", ".join(f"{value:.0f} W" for _, value in power) or "-"
        steps = samples.get("raypulse_train_step", [])
        for labels, step in steps:
            rank = labels.get("rank")
            table.add_row(exporter["node"], rank, f"{step:.0f}", _of(samples, "raypulse_train_loss", rank),
                          _of(samples, "raypulse_train_samples_total", rank),
                          f"{checkpoints[rank]:.0f}" if rank in checkpoints else "-", gpu_util, gpu_power)
            rows += 1
        if not steps and gpus:
            table.add_row(exporter["node"], "-", "-", "-", "-", "-", gpu_util, gpu_power)
            rows += 1
    return table if rows else None


def start_alerting(head_url: str, workdir: Path):
    """Prometheus + Alertmanager with raypulse's rules on the head's /sd, if they are installed."""
    try:
        from scripts import stack
    except ImportError:
        return None
    try:
        return stack.start_demo(workdir, sd_url=head_url + wire.SD_PATH, interval="5s")
    except (OSError, RuntimeError) as exc:
        console.print(f"[yellow]demo: Prometheus did not start ({exc}); continuing without it")
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--keep", action="store_true", help="leave the cluster and Prometheus up until Ctrl-C")
    args = parser.parse_args()
    home = WORKDIR / "launcher"
    run_id = f"demo-{secrets.token_hex(3)}"
    exporter_base = port_base(9477, 6)
    env = {**os.environ, wire.ENV_HOME: str(home)}
    command = [str(Path(sys.executable).with_name("launcher")), "submit", "--name", "demo", "--run-id", run_id,
               "--workers", "2", "--worker-gpus", "1", "--simulate-gpus", "--working-dir", str(REPO / "examples"),
               "--exporter-port", str(exporter_base), "--progress-port", str(exporter_base + 1),
               "--label", "purpose=demo", *(["--keep-cluster"] if args.keep else []),
               "--", f"python train.py --steps {args.steps} --step-seconds 0.25 --checkpoint-every 40"]
    console.rule("[bold]raypulse demo: launcher submit")
    console.print("[dim]$ launcher submit " + " ".join(command[2:-2]) + f" -- '{command[-1]}'")
    # The launcher's step lines (stderr) and the job's output (stdout) are shown between the tables.
    launcher = subprocess.Popen(command, env=env, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, bufsize=1)
    readers = [threading.Thread(target=echo, args=(stream, style), daemon=True)
               for stream, style in ((launcher.stdout, ""), (launcher.stderr, "cyan"))]
    for reader in readers:
        reader.start()
    alerting = None
    stop = threading.Event()

    def forward(signum: int, frame: object) -> None:
        launcher.send_signal(signum)  # the launcher stops the job and tears the cluster down
        stop.set()

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    record = None
    last_table = 0.0
    while launcher.poll() is None:
        # Re-read: the exporters' URLs change to the nodes' IPs once every node is alive.
        record = cluster_record(home, run_id) or record
        if record is not None and alerting is None and not stop.is_set() and answers(record["exporters"][0]["url"]):
            alerting = start_alerting(record["exporters"][0]["url"], WORKDIR / "prometheus") or False
        if record is not None and time.monotonic() - last_table > 8:
            table = progress_table(record["exporters"])
            if table is not None:
                console.print(table)
                last_table = time.monotonic()
        stop.wait(1)
    code = launcher.returncode
    for reader in readers:
        reader.join(5)
    console.rule(f"[bold]launcher exited {code}")
    report = write_report(env, run_id, alerting.prometheus_url if alerting else None)
    if alerting:
        try:
            for promql, what in [
                (f'max by (rank) (max_over_time(raypulse_train_step{{submission_id=~"{run_id}-a.*"}}[10m]))',
                 "last step per rank"),
                (f'sum(max_over_time(raypulse_train_samples_total{{submission_id=~"{run_id}-a.*"}}[10m]))',
                 "samples trained"),
                ('avg(avg_over_time(raypulse_gpu_utilization_ratio[10m]))', "mean GPU utilization (simulated)"),
                (f'max by (state) (max_over_time(raypulse_job_state{{submission_id=~"{run_id}-a.*"}}[10m])) == 1',
                 "job states seen"),
            ]:
                result = alerting.query(promql)
                shown = ", ".join(f"{'/'.join(item['metric'].values()) or 'all'}={float(item['value'][1]):.4g}"
                                  for item in result) or "no data"
                console.print(f"  {what:<34} {shown}   [dim]{promql}")
            for line in alerting.describe():
                console.print(f"  {line}")
            from dashboards.provisioner import provision

            grafana = provision(WORKDIR / "grafana", prometheus_url=alerting.prometheus_url, scrape_interval="5s",
                                default_datasource=True)  # the demo's Grafana has no other
            for line in grafana.instructions().splitlines():
                console.print(f"  {line}")
            if not args.keep:
                console.print("  (the data source points at this demo's Prometheus: "
                              "`make demo ARGS=--keep` keeps it up)")
            if args.keep:
                console.print(f"[bold]--keep[/]: Prometheus {alerting.prometheus_url}, cluster {run_id} "
                              f"(launcher down {run_id}); Ctrl-C to stop")
                signal.signal(signal.SIGINT, signal.default_int_handler)
                with contextlib.suppress(KeyboardInterrupt):
                    signal.pause()
        finally:  # Prometheus and Alertmanager never outlive the demo
            alerting.stop()
    if args.keep and record is not None:
        subprocess.run([str(Path(sys.executable).with_name("launcher")), "down", run_id], env=env, check=False)
    if report is not None:
        console.print(f"[bold]the run's report:[/] {report}  (one HTML file; opens from disk, no network)")
    left = leftovers(run_id)
    console.print("[green]nothing left running[/]" if not left else f"[red]still running: {left}")
    return code if not left else 1


def write_report(env: dict[str, str], run_id: str, prometheus: str | None) -> str | None:
    """`launcher report RUN_ID`, with the demo's Prometheus for the alerts that fired; its path."""
    command = [str(Path(sys.executable).with_name("launcher")), "report", run_id,
               *(["--prometheus", prometheus] if prometheus else [])]
    result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        console.print(f"[yellow]no report: {result.stderr.strip()}")
        return None
    return result.stdout.strip()


def leftovers(run_id: str) -> list[int]:
    """Processes of the demo's cluster still alive (each carries RAYPULSE_CLUSTER_TAG=<run_id>-...)."""
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(wire.ENV_CLUSTER_TAG, "").startswith(f"{run_id}-") \
                    and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


if __name__ == "__main__":
    sys.exit(main())
