"""How the head reads Ray's State API: whether a reply holds every matching row (Ray's own counts
beside the rows), replies parsed off the event loop the same as json.loads, and the fake dashboard
(bench/fakeray.py) answering with the installed Ray's schemas, limits and errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.util.state.common import ActorState, NodeState, PlacementGroupState, TaskState

from bench import fakeray
from bench.fakeray import FakeCluster, Spec, serve
from exporter.collectors.ray import jsonparse
from exporter.collectors.ray.dashboard import DashboardError, DashboardSession, StateList
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "ray"


def test_a_reply_is_whole_when_ray_looked_at_everything_and_sent_every_match():
    # Recorded from Ray 2.60: 8 actors in the GCS, 2 of the job asked for.
    recorded = json.loads((DATA / "actors_of_job.json").read_text())["data"]["result"]
    assert StateList.parse("actors", recorded).complete
    # The GCS stopped at its limit: it looked at 10,550 of 100,000 actors.
    assert not StateList.parse("actors", {"total": 100_000, "num_after_truncation": 10_550, "num_filtered": 408,
                                          "result": []}).complete
    # Every match looked at, but `limit` cut the rows that came back.
    assert not StateList.parse("actors", {"total": 8, "num_after_truncation": 8, "num_filtered": 2,
                                          "result": [{}]}).complete
    # Tasks: `total` also counts attempts Ray lost, so only a reply of the GCS's full 10,000 rows is cut.
    assert StateList.parse("tasks", {"total": 120, "num_after_truncation": 100, "num_filtered": 1,
                                     "result": [{}]}).source_cut is False
    assert StateList.parse("tasks", {"total": 125_000, "num_after_truncation": 10_000, "num_filtered": 10_000,
                                     "result": []}).source_cut


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda children: st.lists(children) | st.dictionaries(st.text(), children),
                           max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(json_values, st.sampled_from([None, 2]))
def test_replies_parse_element_by_element_to_what_json_loads_gives(value, indent):
    text = json.dumps(value, indent=indent)
    assert jsonparse.loads(text) == json.loads(text)


@pytest.mark.parametrize("path", sorted(DATA.glob("*.json")), ids=lambda p: p.name)
def test_recorded_ray_replies_parse_the_same(path):
    text = path.read_text()
    assert jsonparse.loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ["[1,]", '{"a": 1,}', "[1 2]", '{"a" 1}', "[1] x", "{1: 2}", "", "[", '{"a": [1}'])
def test_what_is_not_json_is_refused(text):
    with pytest.raises(ValueError):  # noqa: PT011  (json.JSONDecodeError, as json.loads raises)
        jsonparse.loads(text)


@pytest.mark.parametrize(("fake", "ray"), [
    ((fakeray.ACTOR_COLUMNS, fakeray.ACTOR_DETAIL_COLUMNS, fakeray.ACTOR_FILTERABLE), ActorState),
    ((fakeray.TASK_COLUMNS, fakeray.TASK_DETAIL_COLUMNS, fakeray.TASK_FILTERABLE), TaskState),
    ((fakeray.NODE_COLUMNS, fakeray.NODE_DETAIL_COLUMNS, fakeray.NODE_FILTERABLE), NodeState),
    ((fakeray.PG_COLUMNS, fakeray.PG_DETAIL_COLUMNS, fakeray.PG_FILTERABLE), PlacementGroupState),
], ids=["actors", "tasks", "nodes", "placement_groups"])
def test_the_fake_dashboard_has_the_installed_rays_columns(fake, ray):
    columns, detail_columns, filterable = fake
    assert list(columns) == ray.list_columns(detail=False)
    assert list(detail_columns) == ray.list_columns(detail=True)
    assert set(filterable) == ray.filterable_columns()


async def test_the_fake_dashboard_refuses_what_ray_refuses_and_answers_in_rays_envelope():
    served = await serve(FakeCluster(Spec(nodes=5, actors=300, tasks=500, jobs=5)), metrics_port=None)
    try:
        async with DashboardSession(served.url, 10) as api:
            reply = await api.json("/api/v0/actors")
            assert reply["result"] is True
            assert set(reply["data"]["result"]) == {"total", "num_after_truncation", "num_filtered", "result",
                                                    "partial_failure_warning", "warnings"}
            assert len(reply["data"]["result"]["result"]) == 100  # Ray's default limit
            for params, message in [({"limit": "10001"}, "exceeds the supported limit 10000"),
                                    ({"filter_keys": "death_cause", "filter_predicates": "=", "filter_values": "x"},
                                     "filter column death_cause is not supported"),
                                    ({"filter_keys": "state", "filter_predicates": "=", "filter_values": "GONE"},
                                     "Invalid actor state for filtering: GONE"),
                                    ({"filter_keys": "state", "filter_predicates": ">", "filter_values": "DEAD"},
                                     "Unsupported filter predicate >")]:
                with pytest.raises(DashboardError) as error:
                    await api.json("/api/v0/actors", params)
                assert "400" in str(error.value)
                assert message in str(error.value)
    finally:
        await served.close()


def test_the_clusters_actors_by_state_come_from_the_gcs_series_of_rays_metrics_agent():
    from exporter.collectors.ray.cluster import parse_ray_actors

    text = "\n".join([
        "# HELP ray_actors An actor can be in one of ... states.", "# TYPE ray_actors gauge",
        'ray_actors{JobId="",Name="Learner",SessionName="s",Source="gcs",State="ALIVE"} 3.0',
        'ray_actors{JobId="",Name="Rollout",SessionName="s",Source="gcs",State="ALIVE"} 4.0',
        'ray_actors{JobId="",Name="Rollout",SessionName="s",Source="gcs",State="DEAD"} 2.0',
        'ray_actors{JobId="01000000",Name="Rollout",SessionName="s",Source="executor",State="ALIVE_IDLE"} 4.0',
        "# TYPE ray_node_cpu_utilization gauge", 'ray_node_cpu_utilization{ip="10.0.0.1"} 12.5', ""])
    assert parse_ray_actors(text) == {"ALIVE": 7, "DEAD": 2}
    assert parse_ray_actors('ray_node_cpu_utilization{ip="10.0.0.1"} 12.5\n') is None  # not the head's agent


def test_the_heads_metrics_agent_is_found_from_its_raylets_command_line():
    from exporter.collectors.ray.localray import parse_raylet

    raylet = parse_raylet(7, ["raylet", "--node_id=ab", "--node_ip_address=10.0.0.5", "--metrics_export_port=8080",
                              "--head"])
    assert raylet is not None
    assert raylet.metrics_export_port == 8080
