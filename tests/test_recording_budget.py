"""A long run's record within its budget, and a large cluster's as a distribution (launcher/recording.py,
launcher/record_compaction.py, launcher/record_fleet.py).

The fleet is bench/fakefleet.py: simulated 8-GPU nodes whose expositions carry the exporter's families and
labels, answered through the recorder's own transport hook (ScrapeTarget.reader) with the exporter's ETag
rule; time is the recorder's clock, advanced 15 s a round by the test, so hours of rounds take seconds.

What the recorder guarantees: a run driven past what its budget holds at full resolution is still recorded
from its first round to its last, within the budget, whole in its last hour and around every fault; and
above record_fleet.FLEET_NODES targets it keeps the fleet's distribution per round (series named like
recording rules) and its own series only for the nodes that stand out, are faulty, or were asked for; what
it keeps, `launcher export` writes in a form promtool backfills. With the run's Prometheus (a real one, whose
rule fires on a gauge the test sets), it keeps each of the run's alert windows whole as a fault's.
"""

from __future__ import annotations

import http.server
import math
import subprocess
import threading
from pathlib import Path

import yaml

from bench.fakefleet import FakeFleet
from launcher import export, exposition, record_alerts, record_fleet, recording
from scripts.ports import free_port
from tests.conftest import binary, wait_until

INTERVAL = 15.0
START = 1.7e9


class Driven:
    """A recorder over a FakeFleet whose rounds the test takes, at times it sets."""

    def __init__(self, run_dir: Path, fleet: FakeFleet, **options) -> None:
        self.fleet, self.now, self.times = fleet, START, [START]
        targets = fleet.targets()
        self.rec = recording.Recorder(run_dir, lambda: targets, interval=3600, clock=lambda: self.now,
                                      **options).start()
        wait_until(lambda: self.rec.rounds >= 1, 10, "the recorder's first round")

    def round(self) -> float:
        self.now += INTERVAL
        self.times.append(self.now)
        self.fleet.tick()
        self.rec.record_once()
        return self.now


def test_a_run_longer_than_its_budget_holds_whole_keeps_its_ends_and_every_fault_whole(tmp_path: Path):
    fleet = FakeFleet(4)
    budget = 1024 * 1024  # about two hours of this fleet's rounds at full resolution
    driven = Driven(tmp_path, fleet, max_bytes=budget)
    fault_at = 0.0
    for index in range(6 * 240):  # six hours
        if index == 300:
            fleet.fault(2, "xid")  # an XID on node 2, an hour and a quarter in
        at = driven.round()
        fault_at = at if index == 300 else fault_at
    assert driven.rec.ended is None  # never stopped by its size
    driven.rec.stop()
    times = [*driven.times, driven.now]  # stop() takes a last round

    assert (tmp_path / recording.FILE_NAME).stat().st_size <= budget
    read = recording.read(tmp_path)
    assert [end["reason"] for end in read.ends] == ["stopped"]
    assert read.rounds == len(times)  # every round is in it, whole or rolled up
    [up] = read.select("up", node="node-0001")
    assert up.times[0] == times[0]
    assert up.times[-1] == times[-1]

    def older(stamps: list[float]) -> list[float]:  # before the last hour, away from the fault
        return [t for t in stamps if t < times[-1] - 3600 and not fault_at - 900 <= t <= fault_at + 900]

    assert len(older(up.times)) * 3 < len(older(times))  # rolled up: a point a minute or five, not four
    whole = sorted(t for t in times if t >= times[-1] - 3600)
    assert [t for t in up.times if t >= times[-1] - 3600] == whole  # the last hour at full resolution
    [xid] = read.select("raypulse_gpu_xid_errors_total", node="node-0002", gpu="3")
    around = [t for t in times if fault_at - 600 <= t <= fault_at + 600]
    assert [t for t in xid.times if fault_at - 600 <= t <= fault_at + 600] == around  # whole around the fault
    assert any(abs(mark["t"] - fault_at) < 1 for mark in read.marks)


def test_a_large_cluster_keeps_the_fleets_distribution_and_its_outlying_faulty_and_asked_for_nodes(tmp_path: Path):
    fleet = FakeFleet(100)
    driven = Driven(tmp_path, fleet, record_nodes=frozenset({"node-0042"}))
    for index in range(60):
        if index == 20:
            fleet.fault(5, "idle")  # GPU 3 at 0% among GPUs at 85-95%: an outlier
        if index == 30:
            fleet.fault(7, "xid")
        if index == 35:
            fleet.fault(9, "down")
        if index == 38:
            fleet.heal(9)
        driven.round()
    driven.rec.stop()

    read = recording.read(tmp_path)
    median = read.select(record_fleet.series_name("raypulse_gpu_utilization_ratio", "p50"), role="worker")[0]
    assert len(median.times) == read.rounds == 62  # every round's distribution
    assert "node" not in median.labels
    assert "gpu" not in median.labels
    [count] = read.select(record_fleet.series_name("raypulse_gpu_utilization_ratio", "count"), role="worker")
    assert set(count.values) == {99 * 8.0, 98 * 8.0}  # GPUs answering: one node was down for three rounds
    [low] = read.select(record_fleet.series_name("raypulse_gpu_utilization_ratio", "min"), role="worker")
    assert low.values[0] > 0.8
    assert low.values[-1] == 0.0
    per_node = {s.labels["node"] for s in read.select("raypulse_gpu_utilization_ratio") if s.times}
    assert per_node == {"node-0005", "node-0007", "node-0009", "node-0042"}
    [idle] = read.select("raypulse_gpu_utilization_ratio", node="node-0005", gpu="3")
    assert idle.times[0] == driven.times[21]
    assert idle.values[0] == 0.0
    [down] = read.select("up", node="node-0009")
    assert 0.0 in down.values
    assert len(read.series) < 100 * 81 / 10  # not every node's series
    assert len(read.marks) >= 3  # the XID, the node down, the node back

    om = tmp_path / "fleet.om"
    assert export.export(tmp_path, om) > 0
    text = om.read_text()
    assert "# TYPE fleet:raypulse_gpu_utilization_ratio:p95 gauge" in text
    assert 'raypulse_gpu_utilization_ratio{cluster="fleet",gpu="3"' in text  # a kept node's own series, raw
    result = subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(om),
                             str(tmp_path / "tsdb")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "NUM SAMPLES" in result.stdout


class Alarm:
    """A real HTTP server serving one gauge per cluster, `test_alarm{cluster}`, in the text format, for a real
    Prometheus to scrape; an alert rule fires on it while the test sets it to 1."""

    def __init__(self) -> None:
        self.values = {"fleet": 0.0, "other": 1.0}  # another cluster's alert fires all along: not this run's
        alarm = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = "# TYPE test_alarm gauge\n" + "".join(
                    f'test_alarm{{cluster="{cluster}"}} {value}\n' for cluster, value in alarm.values.items())
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.address = f"127.0.0.1:{self.server.server_address[1]}"


def alarmed_prometheus(start_prometheus, alarm: Alarm, tmp_path: Path):
    rules = tmp_path / "alarm.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "test", "rules": [
        {"alert": "TestAlarm", "expr": "test_alarm > 0", "labels": {"severity": "warning"}}]}]}))
    return start_prometheus(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "alarm", "static_configs": [{"targets": [alarm.address]}]}]}))


def firing(prometheus, cluster: str) -> bool:
    return any(item["metric"].get("cluster") == cluster for item in prometheus.query(record_alerts.FIRING))


def test_an_alert_window_from_the_runs_prometheus_is_kept_whole_as_a_faults_is(tmp_path: Path, start_prometheus):
    alarm = Alarm()
    prometheus = alarmed_prometheus(start_prometheus, alarm, tmp_path)
    wait_until(lambda: firing(prometheus, "other"), 60, "Prometheus to fire the other cluster's alert")
    fleet = FakeFleet(4)
    run_dir = tmp_path / "run"
    driven = Driven(run_dir, fleet, max_bytes=1024 * 1024, alerts=record_alerts.AlertWatch(prometheus.url))
    began = ended = 0.0
    for index in range(6 * 240):  # six hours; the alert fires for ten minutes an hour and a quarter in
        if index == 300:
            alarm.values["fleet"] = 1.0
            wait_until(lambda: firing(prometheus, "fleet"), 60, "the run's alert to fire")
            began = driven.now
        if index == 340:
            alarm.values["fleet"] = 0.0
            wait_until(lambda: not firing(prometheus, "fleet"), 60, "the run's alert to resolve")
            ended = driven.now
        driven.round()
    driven.rec.stop()
    times = [*driven.times, driven.now]

    read = recording.read(run_dir)
    alerts = [mark for mark in read.marks if mark["why"].startswith("alert ")]
    assert alerts, read.marks
    assert all("TestAlarm" in mark["why"] for mark in alerts)
    since = min(mark["t"] for mark in alerts)
    until = max(mark.get("until", mark["t"]) for mark in alerts)
    # Seen at the first ask after it fired (asks a minute apart), last seen at the last ask before it resolved;
    # the other cluster's alert, firing from the start, is not the run's.
    assert began < since <= began + record_alerts.ASK_EVERY_S
    assert ended - record_alerts.ASK_EVERY_S <= until <= ended
    assert any(mark["why"].endswith("resolved") for mark in alerts)
    [up] = read.select("up", node="node-0001")
    around = [t for t in times if since - recording.WINDOW_S <= t <= until + recording.WINDOW_S]
    assert [t for t in up.times if since - recording.WINDOW_S <= t <= until + recording.WINDOW_S] == around
    older = [t for t in times if t < times[-1] - 3600 and not since - 900 <= t <= until + 900]
    assert len([t for t in up.times if t in set(older)]) * 3 < len(older)  # elsewhere rolled up


def test_a_prometheus_that_cannot_be_asked_is_said_once_and_the_recording_goes_on(tmp_path: Path):
    said: list[tuple[str, dict]] = []
    driven = Driven(tmp_path, FakeFleet(2), alerts=record_alerts.AlertWatch(f"http://127.0.0.1:{free_port()}"),
                    notify=lambda kind, details: said.append((kind, dict(details))))
    for _ in range(20):  # five minutes: five asks
        driven.round()
    driven.rec.stop()
    [(_, details)] = [(kind, details) for kind, details in said if kind == "recording.alerts_unread"]
    assert "Prometheus http://127.0.0.1:" in details["error"]
    assert recording.read(tmp_path).rounds == 22


def test_values_that_moved_are_read_alone_and_recorded_as_the_parser_reads_them(tmp_path: Path, monkeypatch):
    fleet = FakeFleet(2)
    driven = Driven(tmp_path, fleet)
    parsed: list[str] = []
    parse = exposition.text_string_to_metric_families
    monkeypatch.setattr(exposition, "text_string_to_metric_families", lambda text: parsed.append(text) or parse(text))
    for _ in range(3):
        driven.round()  # every GPU gauge and every rank's step and loss moved
    driven.rec.stop()
    assert parsed == []  # each changed line was its series at its place: its value read alone
    read = recording.read(tmp_path)
    [util] = read.select("raypulse_gpu_utilization_ratio", node="node-0001", gpu="2")
    assert util.values == [0.9 + 0.05 * math.sin(v / 7 + 0.37 + 2) for v in (0, 1, 2, 3, 3)]  # stop()'s round: a 304
    [step] = read.select("raypulse_train_step", rank="9")
    assert step.values == [0.0, 1.0, 2.0, 3.0, 3.0]
