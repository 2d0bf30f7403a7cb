"""The head exporter's Ray collector against a Ray dashboard of a few hundred nodes and tens of
thousands of actors and tasks: bench/fakeray.py, which answers with Ray 2.60's limits (10,000 rows),
envelope and filter semantics for a generated cluster whose true counts it knows. No Ray runs.

What the head guarantees there: counts equal the cluster's past 10,000 rows, a read Ray cut is never
taken for the whole (its series are left out and the cut is counted), and /sd names every deployed
exporter's port however many other actors there are."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from bench.fakeray import FakeCluster, Options, Spec, serve
from exporter.collectors.ray import cluster, job_workload
from exporter.collectors.ray.head import TRUNCATIONS, RayHeadCollector
from exporter.config import load_config
from exporter.contract import wire
from exporter.framework.snapshot import SampleSink, Snapshot

pytestmark = pytest.mark.slow

LIMIT = 10_000  # Ray's State API rows per read
FALLBACK_PORT = 9477  # the head exporter's own port: what /sd would say for a node it knows nothing of


def by_label(snapshot: Snapshot, spec, job_id: str | None = None) -> dict[str, float]:
    """The family's samples keyed by their last label (state, reason, ...), of one job (job_id is the first
    label) or all."""
    return {values[-1] if values else "": value for values, value in snapshot.families.get(spec, ())
            if job_id is None or values[0] == job_id}


def every_state(counts: dict[str, int], below: int | None = None) -> dict[str, int]:
    """Counts for every actor state (0 where none), those under `below` only when given."""
    every = {state: counts.get(state, 0) for state in cluster.ACTOR_STATES}
    return {state: count for state, count in every.items() if below is None or count < below}


async def collect(head: RayHeadCollector, runs: int) -> Snapshot:
    for _ in range(runs):
        out = SampleSink(head.name)
        await head.collect(out)
        assert out.partial_errors == 0
    return out.freeze(0.0)


def head_for(url: str, metrics_url: str | None) -> RayHeadCollector:
    # The fake answers on this test's own event loop, tens of thousands of rows a read, while the other lane
    # runs Ray: the product's 3 s read deadline would make these counts depend on the machine's load. What
    # is checked here is what is counted, so reads get the longest deadline the config allows.
    ray = {"dashboard_url": url, "role": "head", "request_timeout_seconds": 60,
           **({"metrics_url": metrics_url} if metrics_url else {})}
    return RayHeadCollector(load_config({"listen": f"127.0.0.1:{FALLBACK_PORT}", "ray": ray}, environ={}))


@pytest.fixture(scope="module")
def fake() -> FakeCluster:
    # 300 nodes sharing hosts two by two (the deploy agent gives them port + 2k), 30,000 actors and
    # 120,000 tasks, half of both in one job: past 10,000 rows in the cluster and in that job.
    return FakeCluster(Spec(nodes=300, actors=30_000, tasks=120_000, jobs=60, running_jobs=3, big_job_share=0.5,
                            raylets_per_host=2, seed=7))


@pytest.fixture
async def dashboard(fake: FakeCluster) -> AsyncIterator:
    served = await serve(fake)
    yield served
    await served.close()


def test_the_fake_cluster_is_past_rays_limits_where_the_test_needs_it(fake: FakeCluster):
    actors = fake.actor_counts()
    assert actors["ALIVE"] > LIMIT
    assert actors["DEAD"] > LIMIT
    big = fake.job_hexes[fake.big_job]
    assert sum(fake.task_counts(big).values()) > LIMIT
    assert fake.actor_counts(big)["ALIVE"] > LIMIT
    # What the old head did to find the deploy actors misses some: the namespace is filtered after the cut.
    by_namespace = fake.list_actors(Options(limit=LIMIT, filters=[("ray_namespace", "=", wire.DEPLOY_NAMESPACE),
                                                                  ("state", "=", "ALIVE")]))
    assert by_namespace["num_after_truncation"] < by_namespace["total"]
    assert by_namespace["num_filtered"] < len(fake.exporter_targets())


async def test_counts_equal_the_clusters_past_10000_rows(fake: FakeCluster, dashboard):
    head = head_for(dashboard.url, dashboard.metrics_url)
    snapshot = await collect(head, runs=2)  # the running jobs are read first, every run

    assert by_label(snapshot, cluster.ACTORS) == every_state(fake.actor_counts())
    for job in fake.running_job_ids():
        tasks = fake.task_counts(job)
        assert by_label(snapshot, job_workload.TASKS, job) == {**dict.fromkeys(job_workload.TASK_STATES, 0), **tasks}
        assert by_label(snapshot, job_workload.TASK_FAILURES, job) == fake.task_failures(job)
        actors = every_state(fake.actor_counts(job))
        whole = every_state(actors, below=LIMIT)
        assert by_label(snapshot, job_workload.ACTORS, job) == whole
        assert by_label(snapshot, job_workload.ACTOR_DEATHS, job) == fake.job_actor_deaths(job)
        restarts = list(by_label(snapshot, job_workload.ACTOR_RESTARTS, job).values())
        if whole == actors:
            assert restarts == [fake.job_actor_restarts(job)]
        else:  # a state of 10,000 actors or more cannot be listed whole: its count and the restarts are left out
            assert restarts == []


async def test_a_cut_read_is_counted_and_warned_about(fake: FakeCluster, dashboard, caplog):
    head = head_for(dashboard.url, dashboard.metrics_url)
    with caplog.at_level(logging.WARNING):
        snapshot = await collect(head, runs=1)
    assert by_label(snapshot, TRUNCATIONS)["actors"] >= 1  # the big job's ALIVE actors
    warnings = [r.getMessage() for r in caplog.records if "10,000-row limit" in r.getMessage()]
    assert len(warnings) == 1
    assert fake.job_hexes[fake.big_job] in warnings[0]


async def test_sd_gives_every_deployed_exporter_its_port_among_many_actors(fake: FakeCluster, dashboard):
    head = head_for(dashboard.url, dashboard.metrics_url)
    await collect(head, runs=1)
    discovery = head.shared.service_discovery.get()
    targets = {group["labels"]["ray_node_id"]: group["targets"] for group in discovery.groups}
    assert targets == {node_id: [target] for node_id, target in fake.exporter_targets().items()}
    assert not any(target.endswith(f":{FALLBACK_PORT}") for [target] in targets.values())


async def test_without_rays_metrics_agent_actors_are_counted_through_the_state_api(fake: FakeCluster, dashboard):
    snapshot = await collect(head_for(dashboard.url, None), runs=1)
    # Two states past 10,000: neither can be counted whole through the State API, so neither is served.
    assert by_label(snapshot, cluster.ACTORS) == every_state(fake.actor_counts(), below=LIMIT)
    assert by_label(snapshot, TRUNCATIONS)["actors"] >= 2


async def test_one_state_past_the_limit_is_what_the_others_leave_of_the_total():
    fake = FakeCluster(Spec(nodes=20, actors=20_000, tasks=1_000, jobs=4, running_jobs=3, big_job_share=0.0))
    actors = fake.actor_counts()
    assert [state for state, count in actors.items() if count >= LIMIT] == ["ALIVE"]
    served = await serve(fake, metrics_port=None)
    try:
        snapshot = await collect(head_for(served.url, None), runs=1)
    finally:
        await served.close()
    assert by_label(snapshot, cluster.ACTORS) == every_state(actors)

