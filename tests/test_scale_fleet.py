"""The launcher against 500 nodes (issue 26), no Ray: a fake fleet of exporters serving a real 8-GPU node's
bytes (bench/scale_launcher.py). Every injected XID 79 is seen, an unchanged node answers 304 on the next
check, and the recorder's round records every node. No timings: what the code guarantees."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import scale_launcher
from launcher import recording
from launcher.health.exporters import from_sd
from launcher.health.faults import Attempt
from launcher.health.policy import HealthPolicy
from launcher.health.watcher import Watcher

pytestmark = pytest.mark.slow

NODES = 500
FAULTY = [7, 250, 499]
DEADLINE_S = 120.0  # this machine serves the whole fleet too: a deadline that is never the question here


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[scale_launcher.Fleet, float]]:
    healthy, faulty, began = scale_launcher.capture(tmp_path_factory.mktemp("bodies"))
    with scale_launcher.fleet(NODES, healthy, faulty, FAULTY) as fake:
        yield fake, began


def test_every_fault_is_seen_and_an_unchanged_node_answers_304(fleet):
    fake, began = fleet
    policy = HealthPolicy(check_interval_seconds=10, hang_after_seconds=86400, silence_after_seconds=86400)
    watcher = Watcher(policy, from_sd(fake.sd))
    watcher.read_timeout = DEADLINE_S
    watcher.watch(Attempt(1, "scale-a1", started_at=began))

    first = watcher.check()
    assert len(first.reads) == NODES
    assert all(read.ok for read in first.reads)
    assert {fault.node for fault in first.faults} == {f"node-{index}" for index in FAULTY}
    assert first.not_modified == 0

    second = watcher.check()  # nothing changed on any node
    assert second.not_modified == NODES
    assert not second.faults  # each said once
    assert sum(len(read.samples) for read in second.reads) == sum(len(read.samples) for read in first.reads)

    fake.tick()  # every node's ranks advance a step
    third = watcher.check()
    assert third.not_modified == 0
    assert all(read.ok for read in third.reads)
    steps = {sample.value for read in third.reads for sample in read.select("raypulse_train_step")}
    assert steps == {value + 1 for value in
                     {sample.value for read in first.reads for sample in read.select("raypulse_train_step")}}


def test_a_recorder_round_records_every_node_and_an_unchanged_one_costs_304s(fleet, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    fake, _ = fleet
    monkeypatch.setattr(recording, "ROUND_READS_S", DEADLINE_S)
    # Every node's own series, as below record_fleet's size (tests/test_recording_budget.py has the fleet's shape)
    recorder = recording.Recorder(tmp_path, fake.sd, interval=3600, fleet_nodes=NODES)
    recorder.record_once()
    before = fake.counts()["not_modified"]
    recorder.record_once()  # nothing changed: every request of every node is a 304
    assert fake.counts()["not_modified"] - before == NODES * len(recording.requested())
    recorder.stop()

    saved = recording.read(tmp_path)
    ups = {series.labels["node"]: series.values for series in saved.select("up")}
    assert len(ups) == NODES
    assert all(values[:2] == [1.0, 1.0] for values in ups.values())
    gpus = {(series.labels["node"], series.labels["gpu"]) for series in saved.select("raypulse_gpu_up")}
    assert len(gpus) == NODES * scale_launcher.GPUS
    # A 304's values are the last answer's: the second round has every series the first one had.
    first, second = (sum(1 for series in saved.series.values() if len(series.values) > index) for index in (0, 1))
    assert first == second
