"""The launcher over a week of health checks (issue 37's leak test): the run's health loop
(launcher/healing.py's Healing and its Watcher, the product's HealthPolicy defaults: a check every 10 s)
reading the head's fleet document (launcher/health/fleet.py over real loopback HTTP, the product's default
path) through 60,480 checks, a simulated week. Time is compressed: the clock is advanced 10 s a check and
the fleet answers at once. An XID 79 on one node at a third of the week and a hang (every rank stops) at two
thirds each stop their attempt and the next one starts, as the run does, so the fault paths run too.

Printed: the launcher's RSS after the first simulated hour (360 checks) and at the end, each after a
gc.collect(), their ratio, the RSS at each simulated day's end, and this process's CPU-s per check
(utime + stime, the fake head's included) and the checks' own (the thread_time of the checks, the
document's read and parse included; the machine is shared, so wall time means little). `--trace` takes
tracemalloc snapshots after the first hour and at the end and prints the 15 biggest growths by line (it
slows the checks).

The clock: `time.time` of this process is the simulated one (journal events, attempts, the watcher's and
the fleet's times agree); the watcher's monotonic clock is the same, so a check is due every 10 s of it.

    python -m bench.launcher_week [--nodes 100] [--checks 60480] [--trace]
"""

from __future__ import annotations

import argparse
import gc
import http.server
import json
import os
import resource
import tempfile
import threading
import time
import tracemalloc
import urllib.parse
from collections.abc import Mapping

import psutil

from exporter.contract import digest, wire
from exporter.serving.fleet import _join, _Node

GPUS = 8
CHECKS_A_WEEK = 7 * 24 * 360
HOUR_CHECKS = 360
DAY_CHECKS = 24 * HOUR_CHECKS


def rss_mib() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class FakeHead:
    """The head exporter's fleet document (wire.FLEET_PATH) for N simulated 8-GPU nodes, served over loopback
    HTTP. What it copies from exporter/serving/fleet.py: each entry rendered and the document joined (gzip when
    asked) by that module's own `_Node.render` and `_join`; one change counter as the cursor, a generation, and
    `since` answered with the entries changed after it (whole when the generation or cursor is not this one's).
    Each node's digest is exporter/contract/digest.py's `build` of the samples a node's exporter serves (its
    Ray node, 8 GPUs up, the job's processes, 8 ranks' step and progress times, an XID when one was injected);
    the head's own entry lists every Ray node alive. `advance()` is the head's gathering round."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.generation = "bench0000001"
        self.changes = 0
        self.entries: list[_Node] = [_Node(self.name(node), f"10.{node // 250}.{node % 250}.1:9400", 0)
                                     for node in range(nodes)]
        self._lock = threading.Lock()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, name="fake-head", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @staticmethod
    def name(node: int) -> str:
        return f"node-{node:04d}"

    def advance(self, submission: str, step: int, at: float, first: tuple[int, float], xid: tuple[int, float] | None
                ) -> None:
        """A round: every node's digest at this step (reported at `at`); only entries that changed get a new rev."""
        with self._lock:
            for node, entry in enumerate(self.entries):
                samples = self._samples(node, submission, step, at, first, xid[1] if xid and xid[0] == node else None)
                body = digest.encode(digest.build(samples))
                if body != entry.body:
                    self.changes += 1
                    entry.body, entry.error, entry.answered, entry.rev = body, None, True, self.changes
                    entry.render()

    def _samples(self, node: int, submission: str, step: int, at: float, first: tuple[int, float],
                 xid_at: float | None) -> list[tuple[str, Mapping[str, str], float]]:
        job = {"job_id": "02000000", "submission_id": submission}
        found: list[tuple[str, Mapping[str, str], float]] = [
            ("raypulse_ray_node_info", {"node_id": f"ray-{node:04d}", "node_ip": f"10.0.{node}.1"}, 1.0),
            ("raypulse_job_processes", {**job, "process_role": "worker"}, 1.0)]
        found += [("raypulse_gpu_up", {"gpu": str(gpu), "uuid": f"GPU-{node:04d}-{gpu}"}, 1.0) for gpu in range(GPUS)]
        for local in range(GPUS):
            labels = {**job, "rank": str(node * GPUS + local)}
            found += [("raypulse_train_step", labels, float(step)),
                      ("raypulse_train_last_progress_time_seconds", labels, at),
                      ("raypulse_train_first_step", labels, float(first[0])),
                      ("raypulse_train_first_progress_time_seconds", labels, first[1]),
                      ("raypulse_train_reports_total", labels, float(step))]
        if xid_at is not None:
            found.append(("raypulse_gpu_xid_last_timestamp_seconds", {"gpu": "3", "uuid": f"GPU-{node:04d}-3",
                                                                       "xid": "79"}, xid_at))
        if node == 0:  # the head's exporter lists every Ray node
            found += [("raypulse_ray_node_alive", {"node_id": f"ray-{other:04d}", "node_ip": f"10.0.{other}.1"}, 1.0)
                      for other in range(self.nodes)]
        return found

    def document(self, query: Mapping[str, list[str]], gzipped: bool) -> bytes:
        since = query.get(wire.FLEET_SINCE_PARAM, [None])[0]
        generation = query.get(wire.FLEET_GENERATION_PARAM, [None])[0]
        with self._lock:
            cursor = int(since) if since is not None and since.isdigit() else None
            full = cursor is None or generation != self.generation or cursor > self.changes
            entries = [entry.entry for entry in self.entries if full or entry.rev > cursor]  # type: ignore[operator]
            head = {"v": digest.VERSION, "generation": self.generation, "cursor": self.changes, "full": full,
                    "listed": len(self.entries), "read_at": time.time()}
        return _join(head, entries, gzipped)

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        head = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                gzipped = "gzip" in (self.headers.get("Accept-Encoding") or "")
                body = head.document(urllib.parse.parse_qs(url.query), gzipped)
                self.send_response(200 if url.path == wire.FLEET_PATH else 404)
                self.send_header("Content-Type", "application/json")
                if gzipped:
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def week(nodes: int, checks: int, trace: bool) -> dict:
    os.environ["RAYPULSE_HOME"] = tempfile.mkdtemp(prefix="bench-launcher-week-")
    now = [time.time()]
    time.time = lambda: now[0]  # type: ignore[assignment] # the simulated clock, for every reader of time.time()

    from launcher.healing import Healing
    from launcher.health.fleet import FleetReader
    from launcher.health.policy import HealthPolicy
    from launcher.health.watcher import Watcher
    from launcher.journal import Journal
    from launcher.state import RunRecord

    head = FakeHead(nodes)
    policy = HealthPolicy()
    record = RunRecord(run_id="week-1", name="week", backend="local", max_attempts=10)
    journal = Journal(record=record)  # the Python API's: events kept, none shown
    heal = Healing(policy, journal, lambda: [], fleet=FleetReader(lambda: head.url, lambda: None))
    # The run's Watcher, on the simulated clock for its due checks too (Healing makes it on the process's).
    heal.watcher = Watcher(policy, lambda: [], fleet=heal.watcher.fleet, clock=lambda: now[0],
                           monotonic=lambda: now[0])
    attempt, step, first = 1, 0, (1, now[0])

    def start(number: int) -> str:
        submission = f"week-1-a{number}"
        journal.emit("attempt.submitted", attempt=number, submission_id=submission, address="http://head",
                     entrypoint="python train.py", show=False)
        journal.emit("attempt.running", attempt=number, show=False)
        heal.watch(number, submission)
        heal.running(now[0])
        return submission

    def end(number: int, submission: str) -> None:
        journal.emit("attempt.finished", attempt=number, submission_id=submission, status="STOPPED",
                     state="STOPPED", show=False)

    submission = start(attempt)
    xid_at, hang_at = checks // 3, 2 * checks // 3
    xid: tuple[int, float] | None = None
    hung = False
    faults: list[tuple[int, str]] = []
    by_day: list[float] = []
    hour = hour_cpu = None
    snapshot = None
    began = cpu_s()
    launcher_cpu = 0.0  # the checks' own (this thread's), apart from the fake head's serving thread
    for number in range(1, checks + 1):
        now[0] += policy.check_interval_seconds
        if number == xid_at:
            xid = (3 % nodes, now[0])
        if number == hang_at:
            hung = True
        if not hung:  # a step a second; a hung job's digests stay as they were
            step += int(policy.check_interval_seconds)
            head.advance(submission, step, now[0], first, xid)
        at = time.thread_time()
        fault = heal.check()
        launcher_cpu += time.thread_time() - at
        if fault is not None:  # the run stops the attempt and starts the next, resuming where it was
            faults.append((number, fault.kind.value))
            end(attempt, submission)
            attempt += 1
            xid, hung = None, False
            first = (step + 1, now[0])
            submission = start(attempt)
        if number == HOUR_CHECKS:
            hour, hour_cpu = rss_mib(), cpu_s() - began
            if trace:
                tracemalloc.start(10)
                snapshot = tracemalloc.take_snapshot()
        if number % DAY_CHECKS == 0:
            by_day.append(round(rss_mib(), 1))
    end_cpu = cpu_s() - began
    end_rss = rss_mib()
    grown = []
    if snapshot is not None:
        gc.collect()
        grown = [str(stat) for stat in tracemalloc.take_snapshot().compare_to(snapshot, "lineno")[:15]]
    return {"nodes": nodes, "checks": checks, "rss_hour_mib": hour, "rss_end_mib": end_rss,
            "ratio": end_rss / hour if hour else None, "rss_by_day_mib": by_day, "faults": faults,
            "attempts": attempt, "events": len(record.events),
            "cpu_s_per_check_first_hour": hour_cpu / HOUR_CHECKS if hour_cpu else None,
            "cpu_s_per_check": end_cpu / checks, "launcher_cpu_s_per_check": launcher_cpu / checks, "grown": grown}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--checks", type=int, default=CHECKS_A_WEEK)
    parser.add_argument("--trace", action="store_true", help="tracemalloc: the biggest growths after the first hour")
    args = parser.parse_args(argv)
    row = week(args.nodes, args.checks, args.trace)
    for line in row.pop("grown"):
        print(line)
    print(json.dumps(row))
    hour = f"{row['rss_hour_mib']:.1f}" if row["rss_hour_mib"] else "-"
    print("\n| nodes | checks | RSS after the first hour | RSS at the end | end / hour | RSS per day | faults "
          "(check, kind) | CPU-s per check: checks / process |\n|---|---|---|---|---|---|---|---|")
    ratio = f"{row['ratio']:.3f}" if row["ratio"] else "-"
    print(f"| {row['nodes']} | {row['checks']:,} | {hour} MiB | {row['rss_end_mib']:.1f} MiB | {ratio} | "
          f"{', '.join(f'{value:g}' for value in row['rss_by_day_mib'])} | "
          f"{', '.join(f'{at} {kind}' for at, kind in row['faults'])} | "
          f"{row['launcher_cpu_s_per_check']:.4f} / {row['cpu_s_per_check']:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
