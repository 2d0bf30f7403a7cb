"""The watcher's signals from the user's Prometheus (`health.source: prometheus`, issue 36): one query per
rule, the store doing the fan-in. The fleet is real exporters on loopback ports (tests/fleet_support.py),
the Prometheus is the real binary scraping them through the head's /sd, and the same fleet is judged
through the head's fleet document beside it: both must find the same faults and the same blind node.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from alerts.prometheus import config, render
from exporter.contract import digest, wire
from launcher.api import as_spec
from launcher.display import PlainReporter
from launcher.errors import BadInput
from launcher.healing import Healing
from launcher.health.faults import Attempt
from launcher.health.fleet import FleetReader
from launcher.health.policy import FaultClass
from launcher.health.promql import DOWN, NOT_A_DIGEST, RULES, PromqlReader
from launcher.health.watcher import Watcher
from launcher.journal import Journal
from launcher.state import RunRecord
from tests.broken_exporters import ExporterLike
from tests.fleet_support import Fleet
from tests.test_health_fleet import POLICY, SID, alive, node_samples

NODES = [f"workers-{index}" for index in range(4)]


@pytest.fixture
def scraped(start_prometheus) -> Iterator[tuple[Fleet, str]]:
    """The fleet, and a real Prometheus that scrapes every node the head's /sd lists, every second."""
    with Fleet(NODES) as fleet:
        fleet.relist({"head": fleet.head.address})
        prometheus = start_prometheus(render(config(sd_url=fleet.head.url + wire.SD_PATH, scrape_interval="1s",
                                                    rules=[], ray_metrics=False, rollout_metrics=False)))
        yield fleet, prometheus.url


def checked(watcher: Watcher) -> tuple[set[tuple], set[str]]:
    """One check's new faults (kind, key, node, node out) and the nodes it newly found blind."""
    result = watcher.check()
    return ({(fault.kind, fault.key, fault.node, fault.node_out) for fault in result.faults},
            {node for node, _ in result.unreachable})


def test_prometheus_and_the_heads_document_find_the_same_faults_and_the_same_blind_node(scraped):
    fleet, url = scraped
    started = time.time()
    fleet.head.samples = alive({f"id{index}": True for index in range(len(NODES))})
    for index, name in enumerate(NODES):
        fleet.set(name, node_samples(index, 10, started))  # every rank stops at step 10
    watchers = {"prometheus": Watcher(POLICY, lambda: [], promql=PromqlReader(url)),
                "head": Watcher(POLICY, lambda: [], fleet=FleetReader(lambda: fleet.head.url, lambda: None))}
    for watcher in watchers.values():
        watcher.watch(Attempt(1, SID, started_at=started - 1))

    found: dict[str, set[tuple]] = {name: set() for name in watchers}
    blind: dict[str, list[str]] = {name: [] for name in watchers}

    def check(name: str) -> None:
        faults, unreachable = checked(watchers[name])
        found[name] |= faults
        blind[name] += sorted(unreachable)

    def every_rank_read(name: str) -> bool:
        check(name)
        progress = watchers[name].last.progress
        return sorted(progress.step if progress else {}) == list(range(2 * len(NODES)))

    deadline = time.monotonic() + 60
    while not all(every_rank_read(name) for name in watchers):  # the baseline, every node in it
        assert time.monotonic() < deadline, {name: w.last for name, w in watchers.items()}
        time.sleep(0.3)
    assert watchers["prometheus"].last.source == "prometheus"
    assert watchers["head"].last.source == "head"

    fleet.set("workers-0", node_samples(0, 10, started, xid_at=time.time()))
    fleet.call(fleet.nodes["workers-3"].exporter.stop())  # a node whose exporter stops answering: blind
    wanted = {(FaultClass.GPU_FAULT, True), (FaultClass.HANG, False)}  # the hang: maybe found already
    deadline = time.monotonic() + 60
    while any({(kind, out) for kind, _, _, out in faults} != wanted or not blind[name]
              for name, faults in found.items()):
        assert time.monotonic() < deadline, (found, blind)
        for name in watchers:
            check(name)
        time.sleep(0.3)
    assert found["prometheus"] == found["head"]
    assert (FaultClass.GPU_FAULT, "workers-0") in {(kind, node) for kind, _, node, _ in found["prometheus"]}
    assert blind["prometheus"] == blind["head"] == ["workers-3"]  # said once
    last = watchers["prometheus"].last
    assert last.source == "prometheus"
    assert {read.target.node: read.error for read in last.reads if not read.ok} == {"workers-3": DOWN}
    assert sorted(last.progress.step) == list(range(6))  # the hang is judged on the nodes that answer


def test_a_prometheus_without_the_runs_series_gives_no_document_and_says_why(start_prometheus):
    prometheus = start_prometheus(render(config(targets=[], rules=[])))
    reader = PromqlReader(prometheus.url)
    assert reader.read(5.0, SID) is None
    assert f"no series of submission {SID} yet" in (reader.why_not or "")


def test_a_prometheus_that_does_not_answer_gives_no_document_and_is_asked_again_at_the_next_check():
    reader = PromqlReader("http://127.0.0.1:1")  # nothing listens on port 1
    for _ in range(2):
        reader.why_not = None
        assert reader.read(2.0, SID) is None
        assert (reader.why_not or "").startswith("Prometheus http://127.0.0.1:1: ")


def test_every_family_a_digest_is_made_of_has_its_query():
    assert sorted(rule.family for rule in RULES) == sorted(digest.FAMILIES)


def test_health_source_prometheus_needs_a_prometheus():
    with pytest.raises(BadInput, match=r"health\.source: prometheus .* set prometheus \(--prometheus URL"):
        as_spec({"name": "x", "entrypoint": "python train.py", "health": {"source": "prometheus"}})
    spec = as_spec({"name": "x", "entrypoint": "python train.py", "prometheus": "http://prom:9090",
                    "health": {"source": "prometheus"}})
    assert spec.health.source == "prometheus"


def test_while_prometheus_cannot_say_the_run_is_watched_from_the_heads_document_and_the_journal_says_so_once():
    with Fleet(["workers-0"]) as fleet:
        fleet.relist()
        fleet.set("workers-0", node_samples(0, 10, time.time()))
        record = RunRecord(run_id="promql-1", name="promql", backend="existing", max_attempts=2)
        journal = Journal(PlainReporter(), record)
        heal = Healing(POLICY, journal, lambda: [], fleet=FleetReader(lambda: fleet.head.url, lambda: None),
                       promql=PromqlReader("http://127.0.0.1:1"))  # nothing listens on port 1
        heal.watch(1, SID)
        for _ in range(3):
            while not heal.watcher.due():
                time.sleep(0.05)
            heal.check()
            assert heal.watcher.last.source == "head"
            assert [read.target.node for read in heal.watcher.last.reads] == ["workers-0"]
    [said] = [event.details for event in record.events if event.kind == "health.source_fallback"]
    assert said["source"] == "head"
    assert said["why"].startswith("Prometheus http://127.0.0.1:1: ")


def test_a_node_whose_series_are_past_a_digests_bounds_is_an_entry_that_says_so_and_the_others_are_judged(
        start_prometheus):
    progress = f'raypulse_train_last_progress_time_seconds{{submission_id="{SID}",rank="0"}} {time.time()}\n'
    hostile = f'raypulse_gpu_xid_last_timestamp_seconds{{gpu="{"x" * 300}",uuid="u",xid="79"}} {time.time()}\n'
    with ExporterLike(progress) as fine, ExporterLike(hostile) as bad:
        prometheus = start_prometheus(render(config(targets=[(fine.address, {"node": "fine"}),
                                                             (bad.address, {"node": "bad"})],
                                                    labels={"cluster": "c"}, scrape_interval="1s", rules=[])))
        reader = PromqlReader(prometheus.url)
        deadline = time.monotonic() + 30
        while len(reads := reader.read(5.0, SID) or []) < 2 or not all(read.answered_before for read in reads
                                                                        if not read.ok):
            assert time.monotonic() < deadline, reads
            time.sleep(0.3)
    found = {read.target.node: read for read in reads}
    assert found["bad"].error == NOT_A_DIGEST
    assert found["fine"].digest.jobs[SID].ranks[0][1] is not None
