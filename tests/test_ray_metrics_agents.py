"""Every Ray node's metrics agent at the head exporter's /sd/ray (exporter/collectors/ray/metrics_agents.py):
read from the discovery file Ray's dashboard writes, labelled like the node's exporter, served beside /sd
(which keeps listing raypulse's exporters only), and scraped by the `ray` job of the Prometheus config.
The live path (a gauge named as vLLM names it, through Ray's metrics agent into Prometheus) is in
test_ray_collectors_live.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp
import pytest

from alerts import prometheus
from bench.fakeray import FakeCluster, Spec, serve
from exporter.collectors.ray import metrics_agents
from exporter.collectors.ray.head import RayHeadCollector
from exporter.config import load_config
from exporter.contract import wire
from exporter.framework.shared import ServiceDiscovery
from exporter.framework.snapshot import SampleSink
from exporter.serving.server import Exporter

EXPORTERS = (
    {"targets": ["10.0.0.4:9477"], "labels": {"cluster": "c1", "node": "head", "role": "head", "ray_node_id": "aa"}},
    {"targets": ["[fd00::5]:19477"], "labels": {"cluster": "c1", "node": "gpu-1", "role": "worker",
                                                "ray_node_id": "bb"}},
    {"targets": ["10.0.0.7:9477"], "labels": {"cluster": "c1", "node": "cpu-1", "role": "worker", "ray_node_id": "cc"}},
    {"targets": ["10.0.0.7:9479"], "labels": {"cluster": "c1", "node": "cpu-2", "role": "worker", "ray_node_id": "dd"}},
)


def write_rays_file(session_dir: Path, targets: list[str]) -> None:
    """What Ray 2.60's PrometheusServiceDiscoveryWriter writes (ray/_private/metrics_agent.py)."""
    session_dir.mkdir(parents=True, exist_ok=True)
    (session_dir / wire.RAY_SD_FILE).write_text(json.dumps([{"labels": {"job": "ray"}, "targets": targets}]))


def test_each_agent_gets_the_labels_of_the_exporter_at_its_address(tmp_path: Path):
    # The head's agent, a GPU worker's (IPv6), the autoscaler's and dashboard's (on the head), two Ray
    # nodes sharing a host, and a node whose exporter /sd does not list (yet).
    write_rays_file(tmp_path, ["10.0.0.4:44217", "[fd00::5]:8080", "10.0.0.4:44227", "10.0.0.7:8080",
                               "10.0.0.7:8081", "10.0.0.9:8080", "10.0.0.4:44217"])
    targets = metrics_agents.read_targets([tmp_path / "missing", tmp_path])
    assert targets == ["10.0.0.4:44217", "[fd00::5]:8080", "10.0.0.4:44227", "10.0.0.7:8080", "10.0.0.7:8081",
                       "10.0.0.9:8080"]  # the first session directory that has the file; each target once
    groups = metrics_agents.agent_groups(targets, EXPORTERS, "c1")
    head, gpu, cpu, unknown = (EXPORTERS[0]["labels"], EXPORTERS[1]["labels"], {"cluster": "c1"}, {"cluster": "c1"})
    assert groups == [{"targets": [target], "labels": labels} for target, labels in (
        ("10.0.0.4:44217", head), ("[fd00::5]:8080", gpu), ("10.0.0.4:44227", head),
        ("10.0.0.7:8080", cpu), ("10.0.0.7:8081", cpu), ("10.0.0.9:8080", unknown))]


@pytest.mark.parametrize(("content", "said"), [
    (None, "No such file"),
    ("fifo", "not a regular file"),
    ("x" * (metrics_agents.MAX_BYTES + 1), "larger than"),
    ("[" * 100_000, "recursion"),
    ('{"targets": []}', "not a list of target groups"),
    ('[{"labels": {}}]', "without a list of targets"),
])
def test_a_file_ray_did_not_write_is_refused_at_once(tmp_path: Path, content: str | None, said: str):
    path = tmp_path / wire.RAY_SD_FILE
    if content == "fifo":
        os.mkfifo(path)  # no writer: a blocking open would wait forever
    elif content is not None:
        path.write_text(content)
    with pytest.raises(metrics_agents.UnreadableFile, match=said):
        metrics_agents.read_targets([tmp_path])


async def get(port: int, path: str) -> tuple[int, object]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as response:
        return response.status, await response.json(content_type=None) if response.status == 200 else None


async def test_the_head_serves_the_agents_at_sd_ray_and_sd_keeps_the_exporters_alone():
    agents = tuple(metrics_agents.agent_groups(["10.0.0.4:44217", "[fd00::5]:8080"], EXPORTERS, "c1"))
    exporter = Exporter(load_config({"listen": "127.0.0.1:0", "progress": {"listen": "off"}}, environ={}),
                        collectors=[])
    await exporter.start()
    try:
        assert (await get(exporter.port, wire.RAY_SD_PATH))[0] == 404  # no role known yet
        exporter.shared.service_discovery.publish(ServiceDiscovery("head", EXPORTERS, agents))
        assert await get(exporter.port, wire.RAY_SD_PATH) == (200, list(agents))
        assert await get(exporter.port, wire.SD_PATH) == (200, list(EXPORTERS))
        exporter.shared.service_discovery.publish(ServiceDiscovery("worker"))
        assert (await get(exporter.port, wire.RAY_SD_PATH))[0] == 404
    finally:
        await exporter.stop()


async def test_the_head_collector_lists_what_rays_file_says_each_run(tmp_path: Path):
    fake = FakeCluster(Spec(nodes=4, actors=300, tasks=500, jobs=5))
    served = await serve(fake, metrics_port=None)
    session = tmp_path / "ray" / "session_latest"
    procfs = tmp_path / "proc"  # no raylet here: the session directory is ray_temp_dir's session_latest
    procfs.mkdir()

    def head(discover: bool) -> RayHeadCollector:
        return RayHeadCollector(load_config({
            "listen": "127.0.0.1:9477", "cluster": "c1",
            "node": {"procfs": str(procfs), "ray_temp_dir": str(tmp_path / "ray")},
            "ray": {"dashboard_url": served.url, "role": "head", "request_timeout_seconds": 60,
                    "discover_metrics_agents": discover}}, environ={}))

    try:
        collector = head(discover=True)
        await collector.collect(SampleSink(collector.name))
        exporters = collector.shared.service_discovery.get().groups
        ips = [group["targets"][0].rsplit(":", 1)[0] for group in exporters]
        assert len(set(ips)) == len(ips) == 4
        write_rays_file(session, [f"{ip}:8080" for ip in ips])
        await collector.collect(SampleSink(collector.name))
        found = collector.shared.service_discovery.get()
        assert found.groups == exporters  # /sd's groups are the exporters', whatever Ray's file says
        assert [(g["targets"], g["labels"]) for g in found.metrics_agents] == [
            ([f"{ip}:8080"], dict(group["labels"])) for ip, group in zip(ips, exporters, strict=True)]
        write_rays_file(session, [f"{ips[0]}:8080"])  # three nodes gone
        await collector.collect(SampleSink(collector.name))
        assert [g["targets"] for g in collector.shared.service_discovery.get().metrics_agents] == [[f"{ips[0]}:8080"]]
        (session / wire.RAY_SD_FILE).unlink()  # unreadable: the last list stays (the agents still answer)
        await collector.collect(SampleSink(collector.name))
        assert [g["targets"] for g in collector.shared.service_discovery.get().metrics_agents] == [[f"{ips[0]}:8080"]]

        off = head(discover=False)
        write_rays_file(session, [f"{ips[0]}:8080"])
        await off.collect(SampleSink(off.name))
        assert off.shared.service_discovery.get().metrics_agents == ()
    finally:
        await served.close()


def test_the_prometheus_config_scrapes_the_agents_as_job_ray():
    document = prometheus.config(sd_url="https://head:9477/sd", rules=[])
    ours, ray, rollout = document["scrape_configs"]
    assert ray == {"job_name": wire.RAY_METRICS_JOB,
                   "http_sd_configs": [{"url": "https://head:9477/sd/ray", "refresh_interval": "15s"}]}
    assert rollout == {"job_name": wire.ROLLOUT_METRICS_JOB,
                       "http_sd_configs": [{"url": "https://head:9477/sd/rollout", "refresh_interval": "15s"}]}
    assert ours["http_sd_configs"][0]["url"] == "https://head:9477/sd"
    assert [job["job_name"] for job in prometheus.config(sd_url="http://head:9477/sd", ray_metrics=False,
                                                         rules=[])["scrape_configs"]] == ["raypulse", "rollout"]
    assert len(prometheus.config(sd_url="http://head:9477/sd", ray_metrics=False, rollout_metrics=False)
               ["scrape_configs"]) == 1
    assert len(prometheus.config(targets=["10.0.0.4:9477"])["scrape_configs"]) == 1  # no head: no /sd/ray
