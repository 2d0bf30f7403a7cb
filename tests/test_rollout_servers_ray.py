"""`launcher submit --framework-metrics` on a real local Ray cluster (tests/conftest.py's shared one): verl's
real `LLMServerManager` runs in a Ray actor of the job (as verl's TaskRunner runs it, on a worker node), and the
head exporter's /sd/rollout then lists the servers verl's code kept, with the run's submission id: the hook's
Ray task pinned to the head node (exporter/progress/rollout.py) carried the report to the head's progress
endpoint, with the attempt's token. What verl awaits of a replica (its servers on GPUs) is a stand-in that
leaves the address a real replica would (tests/test_rollout_servers.py runs the rest without Ray).
Run under the heavy lock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.contract import wire
from tests.conftest import http_get
from tests.launcher_support import SharedCluster, launcher

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]

RUN = "verl-rollout-1"
SERVERS = ["10.0.0.5:40123", "10.0.0.6:40125"]
JOB = """
import asyncio, json, sys, time, urllib.request
import ray

@ray.remote(num_cpus=1)
class TaskRunner:  # verl's trainer runs in an actor named so; nothing of raypulse here
    def run(self, addresses):
        from omegaconf import OmegaConf
        from verl.workers.rollout import llm_server

        class Replica:  # in place of verl's vLLMReplica: what init_standalone leaves once vLLM runs on GPUs
            def __init__(self, replica_rank, config, model_config, gpus_per_node):
                self.replica_rank = replica_rank

            async def init_standalone(self):
                self._server_address, self._server_handle = addresses[self.replica_rank], None

        class Manager(llm_server.LLMServerManager):
            rollout_replica_class = Replica

        config = OmegaConf.create({"actor_rollout_ref": {"model": {}, "rollout": {
            "name": "vllm", "tensor_model_parallel_size": 1, "data_parallel_size": 1,
            "pipeline_model_parallel_size": 1, "nnodes": 1, "n_gpus_per_node": len(addresses),
            "disaggregation": {"enabled": False}, "prometheus": {"enable": False}, "disable_log_stats": False}}})
        manager = Manager(config)
        asyncio.run(manager._initialize_llm_servers())
        return manager.server_addresses

ray.init()
servers = ray.get(TaskRunner.remote().run.remote(json.loads(sys.argv[1])))
print("servers:", servers)
if servers != json.loads(sys.argv[1]):  # the verdict is the exit status (test_progress_trl_ray.py says why)
    sys.exit(3)
# The head's task runs while the job does: wait (bounded) until the head lists them, as a long verl run would.
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    listed = json.load(urllib.request.urlopen(sys.argv[2]))
    if len(listed) >= 2:
        print("listed:", json.dumps(listed))
        break
    time.sleep(0.5)
"""


def test_verls_servers_reach_the_heads_sd_rollout_through_a_task_on_the_head(shared_cluster: SharedCluster,
                                                                             tmp_path: Path):
    record = shared_cluster.record()
    head = next(exporter for exporter in record["exporters"] if exporter["role"] == "head")
    sd_url = head["url"] + wire.ROLLOUT_SD_PATH
    work = tmp_path / "job"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    done = launcher("submit", "--cluster", SharedCluster.name, "--run-id", RUN, "--framework-metrics",
                    "--working-dir", str(work), "--no-health", "--max-retries", "0", "--log-style", "record",
                    "--", f"python job.py '{json.dumps(SERVERS)}' {sd_url}", home=shared_cluster.home, timeout=360)
    assert done.returncode == 0, done.stdout + done.stderr  # 0: verl's manager ended with SERVERS (the job's check)
    status, _, body = http_get(sd_url)
    assert status == 200
    ours = [group for group in json.loads(body) if group["labels"]["submission_id"].startswith(RUN)]
    assert [group["targets"] for group in ours] == [[server] for server in SERVERS]
    for group in ours:
        assert group["labels"][wire.ROLLOUT_LABEL] == "vllm"
        assert group["labels"]["job_id"]  # looked up in Ray's Jobs API
        assert group["labels"]["cluster"]
