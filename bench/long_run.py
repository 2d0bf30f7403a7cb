"""A long run's record (launcher/recording.py within its budget; above 64 nodes the fleet's distribution):
a simulated run of `--hours` at 15 s rounds on a fleet of 8-GPU nodes (bench/fakefleet.py: the exporter's
families, answered in process through the recorder's transport hook, no HTTP), with two faults (an XID at a
third of the run, a GPU idle for half an hour at two thirds) and a restart (an attempt ending and the next
starting, marked as the run marks them) at half. Time is compressed: the recorder's clock is advanced 15 s
a round and the fleet answers at once; its values move every `--change-every` rounds (a 304 in between, as
an exporter whose collectors have not published yet), since reading every node's changed body every round
(~0.8 s a round at 2,000 nodes here, most lines' values read alone) would make a simulated week at 2,000
nodes take about 9 hours (that cost per round, over HTTP, is bench.scale_launcher's).

Per size, in a process of its own: the record's size, what it covers (first and last round, rounds held),
whether every round within ten minutes of each fault and the restart is whole, the recorder's RSS after the
first simulated day (every level of the budget then holds rounds: whole for 6 h, per minute to 24 h), the
highest after it and at the end (a leak grows after the first day; what the levels hold stops growing there),
and the wall time; then `launcher report`'s build time, peak RSS and
HTML size, in another process of its own.

    python -m bench.long_run [--nodes 100,2000] [--hours 168] [--change-every 20]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.fakefleet import FakeFleet

INTERVAL = 15.0
START = 1.7e9
WINDOW_S = 600.0


def rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def record(nodes: int, hours: float, change_every: int, run_dir: Path) -> dict:
    from launcher import record_fleet, recording

    fleet = FakeFleet(nodes)
    targets = fleet.targets()
    now = [START]
    rec = recording.Recorder(run_dir, lambda: targets, interval=INTERVAL, clock=lambda: now[0])
    rec._stop.set()  # no loop of its own: this bench takes every round, at the times it sets
    rec.start()
    total = int(hours * 3600 / INTERVAL)
    xid_at, restart_at, idle_at = total // 3, total // 2, 2 * total // 3
    events: dict[str, float] = {}
    began = time.perf_counter()
    day = int(86400 / INTERVAL)
    rss_by_day: list[float] = []  # at the end of each simulated day
    for index in range(total):
        if index == xid_at:
            fleet.fault(3 % nodes, "xid")
        if index == idle_at:
            fleet.fault(11 % nodes, "idle")
        if index == idle_at + 120:
            fleet.heal(11 % nodes)
        if index == restart_at:
            rec.mark("attempt 1 ended")
            rec.mark("attempt 2 started")
            events["restart"] = now[0]  # the marks' time
        if index % change_every == 0:
            fleet.tick(steps=change_every)
        now[0] += INTERVAL
        rec.record_once()
        for name, at in (("xid", xid_at), ("idle", idle_at)):
            if index == at:
                events[name] = now[0]
        if (index + 1) % day == 0:
            rss_by_day.append(rss_mib())
    rec.stop()
    wall = time.perf_counter() - began
    end_rss = rss_mib()
    times = [START + INTERVAL * (index + 1) for index in range(total)]  # every round's time, made after the RSS
    read = recording.read(run_dir)
    # A series every round has: a small cluster's first node's `up`, a fleet's count of targets answering.
    [up] = (read.select(record_fleet.series_name(recording.UP, "count")) or read.select(recording.UP))[:1]
    times.append(now[0])  # stop()'s last round
    whole = {name: [t for t in up.times if abs(t - at) <= WINDOW_S] == [t for t in times if abs(t - at) <= WINDOW_S]
             for name, at in events.items()}
    return {"nodes": nodes, "hours": hours, "rounds": total + 1, "rounds_held": read.rounds,
            "bytes": rec.path.stat().st_size, "series": len(read.series),
            "first": up.times[0] == times[0], "last": up.times[-1] == now[0], "whole_around": whole,
            "points_of_up": len(up.times), "rss_by_day_mib": rss_by_day, "rss_end_mib": end_rss,
            "wall_s": wall, "ended": rec.ended}


def build_report(run_dir: Path) -> dict:
    from launcher import report

    began = time.perf_counter()
    path = report.render(run_dir, run_dir / "report.html")
    return {"report_s": time.perf_counter() - began,
            "report_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "html_mib": path.stat().st_size / 2**20}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,2000")
    parser.add_argument("--hours", type=float, default=168.0)
    parser.add_argument("--change-every", type=int, default=20)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.report:
        print(json.dumps(build_report(args.report)))
        return 0
    if args.one:
        print(json.dumps(record(args.one, args.hours, args.change_every, args.dir)))
        return 0
    rows = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        run_dir = Path(tempfile.mkdtemp(prefix=f"bench-long-{nodes}-"))
        base = [sys.executable, "-m", "bench.long_run", "--hours", str(args.hours), "--change-every",
                str(args.change_every), "--dir", str(run_dir)]
        row = json.loads(subprocess.run([*base, "--one", str(nodes)], check=True, capture_output=True,
                                        text=True).stdout.splitlines()[-1])
        row |= json.loads(subprocess.run([sys.executable, "-m", "bench.long_run", "--report", str(run_dir)],
                                         check=True, capture_output=True, text=True).stdout.splitlines()[-1])
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\n{args.hours:g} simulated hours at {INTERVAL:g} s rounds, values moving every {args.change_every} "
          "rounds\n")
    print("| | " + " | ".join(f"{r['nodes']} nodes" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    table = (("record covers first to last round", lambda r: "yes" if r["first"] and r["last"] else "no"),
             ("rounds held (whole or rolled up) / taken", lambda r: f"{r['rounds_held']} / {r['rounds']}"),
             ("record size", lambda r: f"{r['bytes'] / 2**20:.1f} MiB"),
             ("series in it", lambda r: str(r["series"])),
             ("whole within 10 min of each fault and the restart",
              lambda r: "yes" if all(r["whole_around"].values()) else f"no: {r['whole_around']}"),
             ("recorder RSS after the first day / highest after it / at the end", _rss),
             ("wall time to simulate", lambda r: f"{r['wall_s']:.0f} s"),
             ("`launcher report`: build time, peak RSS, HTML",
              lambda r: f"{r['report_s']:.1f} s, {r['report_peak_rss_mib']:.0f} MiB, {r['html_mib']:.1f} MiB"))
    for label, cell in table:
        print(f"| {label} | " + " | ".join(cell(r) for r in rows) + " |")
    return 0


def _rss(row: dict) -> str:
    days = row["rss_by_day_mib"]
    if not days:
        return f"- / - / {row['rss_end_mib']:.0f} MiB (shorter than a day)"
    first, end = days[0], row["rss_end_mib"]
    return (f"{first:.0f} / {max([*days[1:], end]):.0f} / {end:.0f} MiB "
            f"({(end - first) / first:+.0%} from the first day's)")


if __name__ == "__main__":
    raise SystemExit(main())
