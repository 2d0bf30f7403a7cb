"""A long run's record within its budget, and a large cluster's as a distribution (launcher/recording.py,
launcher/record_compaction.py, launcher/record_fleet.py).

The fleet is bench/fakefleet.py: simulated 8-GPU nodes whose expositions carry the exporter's families and
labels, answered through the recorder's own transport hook (ScrapeTarget.reader) with the exporter's ETag
rule; time is the recorder's clock, advanced 15 s a round by the test, so hours of rounds take seconds.

What the recorder guarantees: a run driven past what its budget holds at full resolution is still recorded
from its first round to its last, within the budget, whole in its last hour and around every fault; and
above record_fleet.FLEET_NODES targets it keeps the fleet's distribution per round (series named like
recording rules) and its own series only for the nodes that stand out, are faulty, or were asked for; what
it keeps, `launcher export` writes in a form promtool backfills.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.fakefleet import FakeFleet
from launcher import export, record_fleet, recording
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
