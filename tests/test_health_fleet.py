"""The fleet watch (issue 36): every node's exporter serves its health digest, the head's gathers them
into one document, and the launcher judges faults from it as it judges them from direct reads. The
nodes and the head are real exporters on loopback ports (tests/fleet_support.py); slow and silent
nodes are real sockets that never answer in time (tests/broken_exporters.py).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator

import pytest

from exporter.contract import digest, wire
from launcher.display import PlainReporter
from launcher.healing import Healing
from launcher.health.exporters import Target
from launcher.health.faults import Attempt
from launcher.health.fleet import FleetReader
from launcher.health.policy import FaultClass, HealthPolicy
from launcher.health.watcher import Watcher
from launcher.journal import Journal
from launcher.state import RunRecord
from tests.broken_exporters import RawServer, gzip_bomb, not_an_exposition, trickle_headers
from tests.conftest import wait_until
from tests.fleet_support import Fleet, Sample

SID = "fleet-1-a1"
POLICY = HealthPolicy(check_interval_seconds=0.5, hang_after_seconds=4, silence_after_seconds=600, stacks=False)


def node_samples(index: int, step: int, at: float, *, xid_at: float | None = None, nonfinite: float = 0,
                 gpu_lost: bool = False) -> list[Sample]:
    """Node `index`: two GPUs, ranks 2i and 2i+1 of the job at `step` (reported at `at`), its Ray node."""
    job = {"job_id": "02000000", "submission_id": SID}
    found: list[Sample] = [("raypulse_ray_node_info", {"cluster_name": "c", "node_id": f"id{index}",
                                                        "node_ip": "127.0.0.1", "node_role": "worker"}, 1.0),
                           ("raypulse_job_processes", {**job, "process_role": "worker", "actor_class": "",
                                                       "actor_role": ""}, 1.0)]
    for gpu in range(2):
        found.append(("raypulse_gpu_up", {"gpu": str(gpu), "uuid": f"GPU-{index}-{gpu}"},
                      0.0 if gpu_lost and gpu == 1 else 1.0))
    for rank in (2 * index, 2 * index + 1):
        labels = {**job, "rank": str(rank)}
        found += [("raypulse_train_step", labels, float(step)),
                  ("raypulse_train_last_progress_time_seconds", labels, at),
                  ("raypulse_train_first_step", labels, 1.0),
                  ("raypulse_train_first_progress_time_seconds", labels, at)]
        if nonfinite:
            found.append(("raypulse_train_nonfinite_values_total", {**labels, "field": "loss"}, nonfinite))
    if xid_at is not None:
        found.append(("raypulse_gpu_xid_last_timestamp_seconds", {"gpu": "1", "uuid": f"GPU-{index}-1", "xid": "79"},
                      xid_at))
    return found


def alive(ids: dict[str, bool]) -> list[Sample]:
    return [("raypulse_ray_node_alive", {"node_id": node_id, "node_ip": "127.0.0.1", "node_role": "worker"},
             1.0 if up else 0.0) for node_id, up in ids.items()]


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    with Fleet([f"workers-{index}" for index in range(4)]) as running:
        running.relist({"head": running.head.address})
        yield running


def direct_targets(fleet: Fleet, extra: dict[str, str] | None = None) -> list[Target]:
    found = [Target(name, node.url) for name, node in fleet.nodes.items()]
    return [*found, Target("head", fleet.head.url), *(Target(name, f"http://{address}")
                                                         for name, address in (extra or {}).items())]


def fleet_reader(fleet: Fleet) -> FleetReader:
    return FleetReader(lambda: fleet.head.url, lambda: None)


def get(url: str, **headers: str) -> tuple[int, bytes, str | None]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), response.headers.get("ETag")
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers.get("ETag")


def test_a_node_serves_its_digest_with_an_etag_and_a_304_while_it_is_unchanged(fleet: Fleet):
    now = time.time()
    fleet.set("workers-1", node_samples(1, 7, now, xid_at=now))
    status, body, etag = get(fleet.nodes["workers-1"].url + wire.DIGEST_PATH)
    assert (status, etag is not None) == (200, True)
    seen = digest.NodeDigest.model_validate_json(body)
    assert seen.xids == ((79, "1", "GPU-1-1", now),)
    assert {rank: step for rank, (step, *_) in seen.jobs[SID].ranks.items()} == {2: 7, 3: 7}
    assert get(fleet.nodes["workers-1"].url + wire.DIGEST_PATH, **{"If-None-Match": etag})[0] == 304


def test_the_head_lists_every_node_then_only_the_nodes_that_changed(fleet: Fleet):
    now = time.time()
    for index, name in enumerate(fleet.nodes):
        fleet.set(name, node_samples(index, 10, now))
    reader = fleet_reader(fleet)
    first = reader.read(3.0, 1.0)
    assert first is not None
    assert sorted(read.target.node for read in first) == ["head", *sorted(fleet.nodes)]
    assert all(read.ok and not read.not_modified for read in first)
    fleet.set("workers-2", node_samples(2, 11, now + 1))

    def changed() -> list[str]:
        reads = reader.read(3.0, 1.0)
        assert reads is not None
        assert len(reads) == 5  # the whole fleet, kept from the last answers
        return [read.target.node for read in reads if not read.not_modified]

    deadline = time.monotonic() + 20
    while (names := changed()) != ["workers-2"]:
        assert names == [], names  # nothing else ever changes
        assert time.monotonic() < deadline
        time.sleep(0.3)


def test_the_heads_document_and_direct_reads_find_the_same_faults(fleet: Fleet):
    started = time.time()
    ids = {f"id{index}": True for index in range(4)}
    fleet.head.samples = alive(ids)
    for index, name in enumerate(fleet.nodes):
        fleet.set(name, node_samples(index, 10, started))
    watchers = {"fleet": Watcher(POLICY, lambda: [], fleet=fleet_reader(fleet)),
                "direct": Watcher(POLICY, lambda: direct_targets(fleet))}
    for watcher in watchers.values():
        watcher.watch(Attempt(1, SID, started_at=started - 1))
        assert watcher.check().faults == []  # the baseline

    later = time.time()
    fleet.set("workers-0", node_samples(0, 10, started, xid_at=later))
    fleet.set("workers-1", node_samples(1, 10, started, nonfinite=2))
    fleet.set("workers-2", node_samples(2, 10, started, gpu_lost=True))
    fleet.head.samples = alive({**ids, "id3": False})
    found: dict[str, set[tuple]] = {name: set() for name in watchers}
    wanted = {FaultClass.GPU_FAULT: 2, FaultClass.NONFINITE_LOSS: 1, FaultClass.NODE_LOST: 1, FaultClass.HANG: 1}
    deadline = time.monotonic() + 30
    while any(sorted(kind for kind, *_ in faults) != sorted(k for k, n in wanted.items() for _ in range(n))
              for faults in found.values()):
        assert time.monotonic() < deadline, found
        for name, watcher in watchers.items():
            found[name] |= {(fault.kind, fault.key, fault.node, fault.node_out) for fault in watcher.check().faults}
        time.sleep(0.3)
    assert found["fleet"] == found["direct"]
    assert watchers["fleet"].last.via_fleet
    assert not watchers["direct"].last.via_fleet


def healing(fleet: Fleet, *, via_fleet: bool, extra: dict[str, str],
            policy: HealthPolicy = POLICY) -> tuple[Healing, RunRecord]:
    record = RunRecord(run_id="fleet-1", name="fleet", backend="local", max_attempts=2)
    journal = Journal(PlainReporter(), record)
    heal = Healing(policy, journal, lambda: direct_targets(fleet, extra),
                   fleet=fleet_reader(fleet) if via_fleet else None)
    journal.emit("attempt.submitted", attempt=1, submission_id=SID, address="http://h", entrypoint="x")
    heal.watch(1, SID)
    return heal, record


def events(record: RunRecord, kind: str) -> list[dict]:
    return [event.details for event in record.events if event.kind == kind]


@pytest.mark.parametrize("via_fleet", [True, False], ids=["fleet", "direct"])
def test_a_node_that_never_answers_is_said_once_and_the_hang_is_judged_on_the_others(fleet: Fleet, via_fleet: bool):
    with RawServer(trickle_headers) as silent:
        fleet.relist({"head": fleet.head.address, "silent": silent.address})
        heal, record = healing(fleet, via_fleet=via_fleet, extra={"silent": silent.address})
        for index, name in enumerate(fleet.nodes):
            fleet.set(name, node_samples(index, 10, time.time()))  # every rank stops at step 10
        fault = None
        deadline = time.monotonic() + 30
        while fault is None:
            assert time.monotonic() < deadline, record.events
            wait = heal.watcher.due
            while not wait():
                time.sleep(0.05)
            fault = heal.check()
    assert fault.kind is FaultClass.HANG
    assert fault.evidence["ranks"] == list(range(8))  # every rank of the nodes read
    [blind] = events(record, "health.exporter_unreachable")
    assert (blind["node"], blind["count"], blind["nodes"]) == ("silent", 1, ["silent"])
    assert heal.watcher.last.via_fleet is via_fleet


@pytest.mark.parametrize("via_fleet", [True, False], ids=["fleet", "direct"])
def test_when_a_tenth_of_the_nodes_miss_the_deadline_one_warning_names_them_and_the_rest_are_judged(
        via_fleet: bool):
    names = [f"workers-{index}" for index in range(18)]
    with Fleet(names) as fleet, RawServer(trickle_headers) as slow_a, RawServer(trickle_headers) as slow_b:
        slow = {"slow-a": slow_a.address, "slow-b": slow_b.address}
        fleet.relist({"head": fleet.head.address, **slow})
        heal, record = healing(fleet, via_fleet=via_fleet, extra=slow,
                               policy=POLICY.model_copy(update={"on_gpu_fault": "report", "hang_after_seconds": 600}))
        for index, name in enumerate(names):
            now = time.time()
            fleet.set(name, node_samples(index, 10, now, xid_at=now if index == 17 else None))
        deadline = time.monotonic() + 40
        while not events(record, "health.fault"):
            assert time.monotonic() < deadline, record.events
            while not heal.watcher.due():
                time.sleep(0.05)
            heal.check()
            assert len(events(record, "health.exporter_unreachable")) <= 1
    [warning] = events(record, "health.exporter_unreachable")
    assert (warning["count"], sorted(warning["nodes"])) == (2, ["slow-a", "slow-b"])
    [fault] = events(record, "health.fault")
    assert (fault["fault"], fault["node"]) == ("gpu_fault", "workers-17")
    assert sum(1 for read in heal.watcher.last.reads if read.ok) == len(names) + 1  # every node that answers


def test_a_node_that_answers_garbage_is_an_entry_that_says_so_and_the_others_are_read(fleet: Fleet):
    fleet.set("workers-0", node_samples(0, 10, time.time()))
    with RawServer(not_an_exposition) as garbage, RawServer(gzip_bomb(2**26)) as bomb:
        fleet.relist({"garbage": garbage.address, "bomb": bomb.address})
        reader = fleet_reader(fleet)
        deadline = time.monotonic() + 20
        while True:
            reads = {read.target.node: read for read in reader.read(3.0, 1.0) or []}
            if reads and all(read.error != digest.NOT_READ_YET for read in reads.values()):
                break
            assert time.monotonic() < deadline, reads
            time.sleep(0.3)
    assert reads["garbage"].error == "a digest that does not parse"
    assert reads["bomb"].error == "a digest in an encoding not asked for"
    assert reads["workers-0"].ok
    assert {rank: step for rank, (step, *_) in reads["workers-0"].digest.jobs[SID].ranks.items()} == {0: 10, 1: 10}


def test_where_the_head_serves_no_document_the_watcher_reads_every_exporter_itself(fleet: Fleet):
    fleet.set("workers-0", node_samples(0, 10, time.time(), xid_at=time.time()))
    not_a_head = FleetReader(lambda: fleet.nodes["workers-1"].url, lambda: None)  # a worker: 404
    watcher = Watcher(POLICY, lambda: direct_targets(fleet), fleet=not_a_head)
    watcher.watch(Attempt(1, SID, started_at=time.time() - 60))
    check = watcher.check()
    assert not check.via_fleet
    assert "HTTP 404" in (not_a_head.why_not or "")
    assert [fault.node for fault in check.faults] == ["workers-0"]
    assert get(fleet.head.url + wire.FLEET_PATH + "?since=x")[0] == 400


async def test_a_digest_the_head_has_not_read_again_for_two_rounds_is_served_as_stale_never_as_now():
    from exporter.serving.fleet import FleetGatherer, _Node

    gatherer = FleetGatherer(lambda: [], interval=10.0, timeout=2.0)
    loop_now = asyncio.get_running_loop().time()
    fresh, old = _Node("fresh", "127.0.0.2:9477", 1), _Node("old", "127.0.0.3:9477", 1)
    for node, read_at in ((fresh, loop_now - 5), (old, loop_now - 23)):  # two rounds and the read deadline: 22 s
        gatherer._nodes[node.target] = node
        gatherer._update(node, digest.encode(digest.build([])), '"e"', None)
        node.checked_at = read_at
    gatherer._expire(loop_now)
    assert (fresh.error, fresh.body is not None) == (None, True)
    assert (old.error, old.body) == ("not read for 23s", None)


def test_nodes_the_head_lists_under_one_name_are_told_apart_by_their_exporter(fleet: Fleet):
    from exporter.framework.shared import ServiceDiscovery

    one, two = fleet.nodes["workers-0"], fleet.nodes["workers-1"]
    groups = tuple({"targets": [node.address], "labels": {"cluster": "c", "node": "10.0.0.5"}} for node in (one, two))
    fleet.head.shared.service_discovery.publish(ServiceDiscovery("head", groups))  # two Ray nodes on one host
    reads = fleet_reader(fleet).read(3.0, 1.0)
    assert reads is not None
    assert sorted(read.target.node for read in reads) == sorted(f"10.0.0.5 ({node.address})" for node in (one, two))


def test_the_head_answers_healthz_while_its_gathering_is_busy(fleet: Fleet):
    """The gathering has a thread of its own: a round held up (here, its listing of the nodes blocked) keeps
    neither /healthz nor /metrics waiting on the exporter's loop."""
    import threading

    head = fleet.head.exporter
    released, entered = threading.Event(), threading.Event()
    listing = head.fleet.gatherer._listing

    def held_listing() -> list[tuple[str, str]] | None:
        entered.set()
        released.wait(30)
        return listing()

    head.fleet.gatherer._listing = held_listing
    asked = threading.Thread(target=get, args=(fleet.head.url + wire.FLEET_PATH,))
    asked.start()
    try:
        assert entered.wait(20), "the head never began a round"
        assert get(fleet.head.url + "/healthz")[0] == 200  # urllib's own 10 s timeout: a blocked loop fails here
        assert get(fleet.head.url + "/metrics")[0] == 200
    finally:
        released.set()
        asked.join(30)
    status, body, _ = get(fleet.head.url + wire.FLEET_PATH)
    assert status == 200
    assert b'"nodes":[' in body


def test_what_a_round_leaves_is_kept_out_of_the_collectors_walks_and_a_cycle_in_it_is_still_freed(monkeypatch):
    """The gatherer freezes what survives its rounds (the kept connections: a full collection's pause at
    10,000 nodes) and unfreezes and collects every UNFREEZE_EVERY_S (here every round), so a cycle that
    was frozen is freed; a gatherer that stops leaves nothing frozen. The collector's own runs are off
    here: only the gatherer's collection can free the cycle."""
    import gc
    import weakref

    from exporter.serving import fleet as fleet_module

    class Cycle:
        pass

    def frozen(thing: object) -> bool:
        return not any(tracked is thing for tracked in gc.get_objects())  # generations 0-2, not the frozen

    monkeypatch.setattr(fleet_module, "UNFREEZE_EVERY_S", 0.0)
    gc.disable()
    try:
        with Fleet(["workers-0"]) as running:
            assert get(running.head.url + wire.FLEET_PATH + "?interval=1")[0] == 200
            cycle = Cycle()
            cycle.me = cycle  # type: ignore[attr-defined]
            freed = weakref.ref(cycle)
            deadline = time.monotonic() + 30
            while not frozen(cycle):
                assert time.monotonic() < deadline, "no round froze what it left"
                time.sleep(0.2)
            del cycle
            while freed() is not None:
                assert time.monotonic() < deadline, "a cycle frozen by a round was never freed"
                time.sleep(0.2)
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("via_fleet", [True, False], ids=["fleet", "direct"])
def test_the_checkpoint_cost_and_interval_reach_the_attempts_record(fleet: Fleet, via_fleet: bool):
    """What checkpoint_advice weighs: the slowest rank's save and the time between saves, either way read."""
    heal, record = healing(fleet, via_fleet=via_fleet, extra={})
    started = time.time()

    def saves(count: int, at: float, step: int) -> None:
        for index, name in enumerate(fleet.nodes):
            found = node_samples(index, step, time.time())
            for rank in (2 * index, 2 * index + 1):
                labels = {"job_id": "02000000", "submission_id": SID, "rank": str(rank)}
                found += [("raypulse_train_checkpoint_duration_seconds", labels, 2.0 + rank),
                          ("raypulse_train_last_checkpoint_time_seconds", labels, at),
                          ("raypulse_train_checkpoints_total", labels, float(count))]
            fleet.set(name, found)

    def seen(count: int) -> bool:
        heal.check()
        item = record.attempt(1)
        return item is not None and item.last_checkpoint is not None and item.last_checkpoint[0] == count

    saves(1, started, 10)
    wait_until(lambda: seen(1), 30, "the first save in the record", interval=0.5)
    saves(4, started + 90, 20)
    wait_until(lambda: seen(4), 30, "the fourth save in the record", interval=0.5)
    item = record.attempt(1)
    assert item is not None
    assert item.checkpoint_seconds == 2.0 + 7  # rank 7's, the slowest
    assert item.checkpoint_interval_s == pytest.approx(30.0)
