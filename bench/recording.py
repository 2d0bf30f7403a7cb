"""What recording a run costs (launcher/recording.py): bytes on disk and the launcher's CPU, per hour
and per day, for a 3-node, 8-GPU run (a head without GPUs, two workers with 4 simulated GPUs each,
8 ranks reporting progress), at the default 15 s interval.

Three real exporters with simulated GPUs run on loopback, listed by an HTTP service discovery
endpoint in the head exporter's /sd shape; a separate process posts every rank's progress twice a
second (so this process's CPU is the recorder's). The recorder's rounds are driven back to back,
`--gap` seconds apart so the simulated GPUs move between them; per round it measures the bytes
appended and this process's CPU (utime + stime: discovery, scrapes, parsing, compression), then
scales to rounds per hour at `--interval`. The first round (it names every series) is reported
apart. The peer, in the same rounds: the raw exposition text of every target, which is what a
recorder keeping everything, uncompressed, would write.

    python -m bench.recording [--rounds 60] [--gap 0.5] [--interval 15]

Not in it: the job families of the head (raypulse_job_*, Ray's view of the job), which need a Ray
cluster; a real run's recording (tests/test_report.py) shows how many series they add.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from exporter.contract import wire
from launcher import recording
from scripts.ports import free_port

REPO = Path(__file__).resolve().parent.parent

POSTER = """
import json, sys, time, urllib.request
ports = [int(p) for p in sys.argv[1].split(",")]
step = 0
while True:
    step += 1
    for node, port in enumerate(ports):
        reports = [{"kind": "progress", "submission_id": "bench-1-a1", "rank": 4 * node + local, "time": time.time(),
                    "step": step, "loss": 3.0 / (1 + step / 100), "samples_total": 256 * step,
                    "tokens_total": 262144 * step, "grad_norm": 1.1, "learning_rate": 3e-4}
                   for local in range(4)]
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/progress",
                                         data=json.dumps({"reports": reports}).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=5).read()
        except OSError:
            pass
    time.sleep(0.5)
"""


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def serve_sd(groups: list[dict]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(groups).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def wait_ready(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"exporter on {port} did not become ready")


def raw_bytes(ports: list[int]) -> int:
    total = 0
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{wire.METRICS_PATH}", timeout=10) as response:
            total += len(response.read())
    return total


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="rounds measured after the first")
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between rounds (the GPUs move meanwhile)")
    parser.add_argument("--interval", type=float, default=recording.DEFAULT_INTERVAL_S, help="the interval scaled to")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="bench-recording-"))
    nodes = [("head", "head", 0), ("workers-1", "worker", 4), ("workers-2", "worker", 4)]
    processes: list[subprocess.Popen] = []
    ports, progress_ports, groups = [], [], []
    try:
        for name, role, gpus in nodes:
            port, progress = free_port(), free_port()
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{port}", "--simulate-gpus",
                 str(gpus), "--progress-listen", f"127.0.0.1:{progress}", "--cluster", "bench", "--ray-role", "worker"],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            ports.append(port)
            progress_ports.append(progress)
            groups.append({"targets": [f"127.0.0.1:{port}"], "labels": {"cluster": "bench", "node": name, "role": role,
                                                                        "ray_node_id": f"{name}-id"}})
        for port in ports:
            wait_ready(port)
        processes.append(subprocess.Popen([sys.executable, "-c", POSTER, ",".join(map(str, progress_ports[1:]))]))
        sd = serve_sd(groups)
        time.sleep(6)  # every collector has published, the ranks have reported
        recorder = recording.Recorder(workdir / "run", f"http://127.0.0.1:{sd.server_port}{wire.SD_PATH}",
                                      interval=3600)
        cpu0 = cpu_seconds()
        recorder.start()
        while recorder.rounds < 1:  # the recorder's own first round, in its thread
            time.sleep(0.05)
        first_bytes, first_cpu = recorder.path.stat().st_size, cpu_seconds() - cpu0
        cpu_total, raw_total = 0.0, 0
        for _ in range(args.rounds):
            time.sleep(args.gap)
            raw_total += raw_bytes(ports)
            before = cpu_seconds()
            recorder.record_once()
            cpu_total += cpu_seconds() - before
        recorder.stop()
        size = recorder.path.stat().st_size
        read = recording.read(workdir / "run")
        series = len(read.series)
        per_round = (size - first_bytes) / args.rounds
        cpu_round = cpu_total / args.rounds
        per_hour = 3600 / args.interval
        raw_round = raw_total / args.rounds
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)

    print(f"3 nodes (head + 2 workers x 4 simulated GPUs), 8 ranks; {args.rounds} rounds after the first; "
          f"scaled to one round every {args.interval:g} s ({per_hour:.0f} rounds/hour)\n")
    print("| | per round | per hour | per day |")
    print("|---|---|---|---|")
    print(f"| recording on disk | {human(per_round)} | {human(per_round * per_hour)} | "
          f"{human(per_round * per_hour * 24)} |")
    print(f"| launcher CPU (recorder) | {cpu_round * 1000:.1f} ms | {cpu_round * per_hour:.1f} s | "
          f"{cpu_round * per_hour * 24 / 60:.1f} min |")
    print(f"| peer: raw /metrics of every target | {human(raw_round)} | {human(raw_round * per_hour)} | "
          f"{human(raw_round * per_hour * 24)} |")
    print(f"\n- series recorded: {series}; first round (names them): {human(first_bytes)}, "
          f"{first_cpu * 1000:.0f} ms CPU")
    print(f"- recording / raw scrapes = {per_round / raw_round:.4f}")
    print(f"- CPU: {cpu_round / args.interval:.3%} of one core at a {args.interval:g} s interval")
    print(f"- days at full resolution that would fit the default budget ({human(recording.DEFAULT_MAX_BYTES)}): "
          f"{recording.DEFAULT_MAX_BYTES / (per_round * per_hour * 24):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
