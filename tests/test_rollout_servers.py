"""An RL run's rollout servers at the head exporter's /sd/rollout (issue 40): verl's real `LLMServerManager`
patched by the --framework-metrics hook reports the servers its own code started, the head holds them in one
bounded set and lists them with the run's labels, and a real Prometheus scrapes vLLM's own names from them
through the `rollout` job of the Prometheus config; the RL board's vLLM row draws them.

Where the boundary is: verl's `_initialize_llm_servers` runs as verl wrote it; what it awaits of a replica
(`init_standalone`: Ray actors that start vLLM on GPUs) is a stand-in that leaves the address a real replica
would (verl's own hook for that: the `rollout_replica_class` attribute its __init__ honours). The Ray task that
carries the report to the head node (exporter/progress/rollout.py `_deliver`) is the one hop not taken: the
verl process plays the head and runs the task's body, `tell_head`, itself (a Ray test would run it as a task).
"""

from __future__ import annotations

import asyncio
import json
import math
import textwrap
import time

import aiohttp
import prometheus_client
import pytest
from aiohttp import web

from alerts import prometheus
from dashboards import promql
from dashboards.boards import rl
from exporter.collectors.ray.train import TrainCollector
from exporter.config import ProgressSettings, load_config
from exporter.contract import vllm, wire
from exporter.framework.shared import ServiceDiscovery, Shared
from exporter.progress.rollout_targets import RolloutTargets
from exporter.progress.store import ProgressStore, Rejected, parse_batch
from exporter.serving.server import Exporter
from tests.conftest import free_port, http_get, wait_until
from tests.test_progress_client import run_client

RAY_TOKEN = "ray-cluster-token"
SUBMISSION = "grpo-1-a1"
MODEL = "tiny-qwen"


def rollout_report(servers: list[str], rollout: str = "vllm", **fields: object) -> dict[str, object]:
    return {"kind": "rollout", "submission_id": SUBMISSION, "time": time.time(), "rollout": rollout,
            "servers": servers, **fields}


def parsed(*reports: dict[str, object]) -> list:
    return parse_batch({"reports": list(reports)})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the bounded set ------------------------------------------------------------------------------------------

def test_a_jobs_servers_are_the_union_of_what_it_reported():
    store = ProgressStore(ProgressSettings(), clock=Clock())
    store.apply(parsed(rollout_report(["10.0.0.5:40001", "10.0.0.6:40001"])))
    store.apply(parsed(rollout_report(["10.0.0.6:40001", "[fd00::7]:40003"], rollout="sglang")))
    assert store.view().rollouts == {("", SUBMISSION): {"10.0.0.5:40001": "vllm", "10.0.0.6:40001": "sglang",
                                                        "[fd00::7]:40003": "sglang"}}
    assert store.job_keys() == [("", SUBMISSION)]
    store.release([("", SUBMISSION)])
    assert store.view().rollouts == {}


def test_past_the_bound_ended_jobs_go_first_then_the_least_recently_reported():
    clock = Clock()
    store = ProgressStore(ProgressSettings(), clock=clock)
    store.rollouts = RolloutTargets(limit=6)
    for index, job in enumerate(("old", "ended", "recent")):
        clock.now += 1
        store.apply(parsed(rollout_report([f"10.0.{index}.1:1", f"10.0.{index}.2:1"], submission_id=job)))
    store.doubtful = frozenset({("", "ended")})
    clock.now += 1
    store.apply(parsed(rollout_report(["10.0.9.1:1", "10.0.9.2:1"], submission_id="new")))
    assert set(store.view().rollouts) == {("", "old"), ("", "recent"), ("", "new")}  # the ended job made room
    clock.now += 1
    store.apply(parsed(rollout_report(["10.0.8.1:1", "10.0.8.2:1"], submission_id="newer")))
    assert set(store.view().rollouts) == {("", "recent"), ("", "new"), ("", "newer")}  # then the oldest
    assert store.rollouts.count == 6


def test_a_job_whose_own_servers_pass_the_bound_is_refused_and_nothing_of_the_batch_is_kept():
    store = ProgressStore(ProgressSettings(), clock=Clock())
    store.rollouts = RolloutTargets(limit=3)
    store.apply(parsed(rollout_report(["10.0.0.1:1"], submission_id="other")))
    batch = parsed({"kind": "progress", "submission_id": SUBMISSION, "time": time.time(), "step": 3},
                   rollout_report([f"10.0.1.{n}:1" for n in range(4)]))
    with pytest.raises(Rejected, match="4 rollout servers; the exporter holds at most 3") as refused:
        store.apply(batch)
    assert refused.value.status == 429
    assert refused.value.reason == "too_many_rollout_servers"
    assert store.view().rollouts == {("", "other"): {"10.0.0.1:1": "vllm"}}
    assert store.jobs == {}
    assert store.rejected["too_many_rollout_servers"] == 1


@pytest.mark.parametrize(("report", "message"), [
    (rollout_report(["10.0.0.5"]), "reports[0].servers[0]: a server is host:port"),
    (rollout_report(["10.0.0.5:70000"]), "reports[0].servers[0]: the port is over 65535"),
    (rollout_report(["http://10.0.0.5:8000/metrics"]), "reports[0].servers[0]: a server is host:port"),
    (rollout_report([]), "reports[0].servers: List should have at least 1 item"),
    (rollout_report([f"10.0.0.5:{n}" for n in range(1, 514)]), "reports[0].servers: List should have at most 512"),
    (rollout_report(["10.0.0.5:1"], rollout="vLLM engine"), "reports[0].rollout: String should match pattern"),
    (rollout_report(["10.0.0.5:1"], rollout=None), "reports[0].rollout: required for kind rollout"),
    ({**rollout_report(["10.0.0.5:1"]), "kind": "progress"}, "reports[0].rollout: only in reports of kind rollout"),
    ({"kind": "progress", "job_id": "02000000", "time": time.time(), "servers": ["10.0.0.5:1"]},
     "reports[0].servers: only in reports of kind rollout"),
])
def test_what_is_not_a_rollout_report_is_refused_naming_the_field(report, message):
    with pytest.raises(Rejected, match=f"^{message}".replace("[", r"\[").replace("]", r"\]")) as refused:
        parse_batch({"reports": [report]})
    assert refused.value.status == 400


# --- the head's /sd/rollout, and the whole way from verl to Prometheus and the board ------------------------------

class FakeVllm:
    """What a verl rollout server serves at /metrics: vLLM 0.24.0's own HTTP server (the version verl 0.9.1
    pins) renders its prometheus_client registry there (vllm/entrypoints/serve/instrumentator/metrics.py); the
    families the RL board reads are copied from PrometheusStatLogger in vllm/v1/metrics/loggers.py of that
    version: their names, kinds and labels (`model_name`, `engine`) and the time-to-first-token buckets."""

    TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)

    def __init__(self, running: int) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        labels = ("model_name", "engine")

        def make(kind: type, name: str, text: str, **extra: object) -> object:
            return kind(name, text, labels, registry=self.registry, **extra).labels(MODEL, "0")

        make(prometheus_client.Gauge, vllm.REQUESTS_RUNNING, "Number of requests in model execution batches.").set(
            running)
        make(prometheus_client.Gauge, vllm.REQUESTS_WAITING, "Number of requests waiting to be processed.").set(2)
        make(prometheus_client.Gauge, vllm.KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.").set(0.5)
        make(prometheus_client.Counter, vllm.PREEMPTIONS, "Cumulative number of preemption from the engine.").inc(1)
        self.tokens = make(prometheus_client.Counter, vllm.GENERATION_TOKENS, "Number of generation tokens processed.")
        self.ttft = make(prometheus_client.Histogram, vllm.TIME_TO_FIRST_TOKEN,
                         "Histogram of time to first token in seconds.", buckets=self.TTFT_BUCKETS)
        self.runner: web.AppRunner | None = None
        self.address = ""

    async def metrics(self, request: web.Request) -> web.Response:
        self.tokens.inc(64)  # an engine that keeps generating, so that rates have something to show
        self.ttft.observe(0.3)
        return web.Response(body=prometheus_client.generate_latest(self.registry),
                            headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.address = f"127.0.0.1:{self.runner.addresses[0][1]}"
        return self.address


VERL_ROLLOUT = """
    import asyncio, json, sys
    from exporter.progress import hooks
    hooks.setup()  # what Ray runs first in every worker of a job submitted with --framework-metrics
    assert "verl" not in sys.modules

    from omegaconf import OmegaConf
    from verl.workers.rollout import llm_server
    from exporter import progress
    from exporter.progress import rollout

    addresses = sys.argv[1:]

    class Replica:
        # In place of verl's vLLMReplica: what its init_standalone leaves once its servers run on the GPUs.
        def __init__(self, replica_rank, config, model_config, gpus_per_node):
            self.replica_rank = replica_rank

        async def init_standalone(self):
            self._server_address, self._server_handle = addresses[self.replica_rank], None

    class Manager(llm_server.LLMServerManager):
        rollout_replica_class = Replica  # verl's hook for recipes (LLMServerManager.__init__)

    config = OmegaConf.create({"actor_rollout_ref": {"model": {}, "rollout": {
        "name": "vllm", "tensor_model_parallel_size": 1, "data_parallel_size": 1, "pipeline_model_parallel_size": 1,
        "nnodes": 1, "n_gpus_per_node": len(addresses), "disaggregation": {"enabled": False},
        "prometheus": {"enable": False}, "disable_log_stats": False}}})
    rollout._deliver = rollout.tell_head  # the hop to the head node: this process plays the head
    manager = Manager(config)
    asyncio.run(manager._initialize_llm_servers())  # verl's own code: the replicas, then server_addresses
    assert progress.flush(10)
    print(json.dumps({"server_addresses": manager.server_addresses, **progress.stats()}))
"""


def make_head() -> Exporter:
    """A head exporter with the train collector (what fills /sd/rollout) and a progress endpoint that wants the
    job's token, as under Ray token authentication; the Ray dashboard does not answer (labels as reported)."""
    config = load_config({"listen": "127.0.0.1:0", "cluster": "c1",
                          "progress": {"listen": "127.0.0.1:0", "token": "required"},
                          "collectors": {"train": {"interval_seconds": 0.5}},
                          "ray": {"dashboard_url": f"http://127.0.0.1:{free_port()}"}}, environ={})
    shared = Shared.for_config(config)
    exporter = Exporter(config, collectors=[TrainCollector(config, shared)], shared=shared)
    exporter.progress.token_key = lambda: RAY_TOKEN
    return exporter


async def get(url: str) -> tuple[int, object]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json(content_type=None) if response.status == 200 else None


async def until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_the_head_serves_sd_rollout_only_as_the_head():
    head = make_head()
    await head.start()
    try:
        url = f"http://127.0.0.1:{head.port}{wire.ROLLOUT_SD_PATH}"
        status, _ = await get(url)
        assert status == 404  # no Ray role known yet
        head.shared.service_discovery.publish(ServiceDiscovery("head"))
        assert await get(url) == (200, [])
        head.shared.service_discovery.publish(ServiceDiscovery("worker"))
        assert (await get(url))[0] == 404
    finally:
        await head.stop()


async def test_a_wrong_token_or_a_bad_report_is_a_4xx_and_nothing_is_listed():
    head = make_head()
    await head.start()
    head.shared.service_discovery.publish(ServiceDiscovery("head"))
    progress_url = f"http://{head.progress.address}{wire.PROGRESS_PATH}"
    token = wire.progress_token(RAY_TOKEN, "submission", SUBMISSION)
    try:
        async with aiohttp.ClientSession() as session:
            for body, authorization, status in (
                    ({"reports": [rollout_report(["10.0.0.5:1"])]}, "Bearer " + "0" * 64, 401),
                    ({"reports": [rollout_report(["10.0.0.5:99999"])]}, f"Bearer {token}", 400),
                    ({"reports": [rollout_report(["10.0.0.5:1"], rollout="../x")]}, f"Bearer {token}", 400)):
                async with session.post(progress_url, json=body, headers={"Authorization": authorization}) as reply:
                    assert reply.status == status, await reply.text()
                    assert "error" in await reply.json()
        await asyncio.sleep(1.2)  # two runs of the train collector
        assert await get(f"http://127.0.0.1:{head.port}{wire.ROLLOUT_SD_PATH}") == (200, [])
    finally:
        await head.stop()


async def test_verls_rollout_servers_are_scraped_with_the_runs_labels_and_drawn_on_the_rl_board(start_prometheus):
    head = make_head()
    engines = [FakeVllm(running=3), FakeVllm(running=4)]
    addresses = [await engine.start() for engine in engines]
    await head.start()
    try:
        exporters = ({"targets": [f"127.0.0.1:{head.port}"],
                      "labels": {"cluster": "c1", "node": "head", "role": "head", "ray_node_id": "aa"}},)
        head.shared.service_discovery.publish(ServiceDiscovery("head", exporters))
        # verl's own manager, patched by the hook, in a fresh interpreter of the job (its token in its environment)
        stats = await asyncio.to_thread(run_client, f"import sys; sys.argv = ['verl', *{addresses!r}]\n"
                                                    + textwrap.dedent(VERL_ROLLOUT), {
            wire.ENV_PROGRESS_URL: f"http://{head.progress.address}", wire.ENV_SUBMISSION_ID: SUBMISSION,
            wire.ENV_PROGRESS_TOKEN: wire.progress_token(RAY_TOKEN, "submission", SUBMISSION)}, 240)
        assert stats["server_addresses"] == addresses
        assert (stats["sent"], stats["dropped"], stats["rejected"]) == (1, 0, 0)

        sd_url = f"http://127.0.0.1:{head.port}{wire.ROLLOUT_SD_PATH}"

        async def listed() -> bool:
            return (await get(sd_url))[1] != []
        await until(listed, 10, "the servers at /sd/rollout")
        labels = {"cluster": "c1", "node": "head", "role": "head", "ray_node_id": "aa", "job_id": "",
                  "submission_id": SUBMISSION, wire.ROLLOUT_LABEL: "vllm"}
        assert (await get(sd_url))[1] == [{"targets": [address], "labels": labels} for address in addresses]

        document = prometheus.config(sd_url=f"http://127.0.0.1:{head.port}{wire.SD_PATH}", scrape_interval="1s",
                                     rules=[])
        assert [job["job_name"] for job in document["scrape_configs"]][-1] == wire.ROLLOUT_METRICS_JOB
        server = await asyncio.to_thread(start_prometheus, prometheus.render(document))

        def running() -> list[dict]:
            return server.query(f'{vllm.native(vllm.REQUESTS_RUNNING)}{{job="{wire.ROLLOUT_METRICS_JOB}"}}')
        await asyncio.to_thread(wait_until, lambda: len(running()) == 2, 60, "both servers scraped")
        found = sorted(running(), key=lambda r: r["metric"]["instance"])
        assert [(r["metric"], r["value"][1]) for r in found] == sorted((
            ({"__name__": vllm.REQUESTS_RUNNING, "job": wire.ROLLOUT_METRICS_JOB, "instance": address,
              **{key: given for key, given in labels.items() if given}, "model_name": MODEL, "engine": "0"}, value)
            for address, value in zip(addresses, ("3", "4"), strict=True)), key=lambda pair: pair[0]["instance"])

        # The board's row: every query of it returns the run's engines, as one series per model.
        variables = {"cluster": "c1", "submission": SUBMISSION}
        macros = {**promql.MACROS, "$__rate_interval": "4s"}

        def board() -> dict[str, list[dict]]:
            return {f"{panel.title}/{target.legend}": server.query(promql.fill(target.expr, variables, macros))
                    for panel in rl.ENGINES.panels for target in panel.targets}
        await asyncio.to_thread(wait_until, lambda: all(board().values()), 60, "every query of the vLLM row")
        drawn = board()
        assert {key: [r["metric"] for r in results] for key, results in drawn.items()} == {
            key: [{"cluster": "c1", "model_name": MODEL}] for key in drawn}
        assert float(drawn["Requests running and waiting/{{model_name}} running"][0]["value"][1]) == 7
        assert float(drawn["KV-cache usage/{{model_name}} fullest engine"][0]["value"][1]) == 0.5
        assert math.isclose(float(drawn["Time to first token/{{model_name}} p50"][0]["value"][1]), 0.375)
        # Another run's engines are not this one's.
        other = {**variables, "submission": "another-run"}
        assert not server.query(promql.fill(rl.ENGINES.panels[0].targets[0].expr, other, macros))
        status, _, body = await asyncio.to_thread(http_get, f"{server.url}/api/v1/targets?state=active")
        assert status == 200
        assert all(t["health"] == "up" for t in json.loads(body)["data"]["activeTargets"]
                   if t["labels"]["job"] == wire.ROLLOUT_METRICS_JOB)
    finally:
        await head.stop()
        for engine in engines:
            if engine.runner is not None:
                await engine.runner.cleanup()
