"""End to end on a real local Ray cluster (a head and a worker raylet, token auth on), with an
exporter per node and a real Prometheus that finds them through the head exporter's /sd.

A launcher-style run fails once (its actors raise) and is resubmitted as attempt 2, whose two
actors burn CPU and report progress until told to stop; a plain job without any raypulse
metadata runs beside it. Everything asserted here is read back from Prometheus.

Run under `flock /tmp/raypulse-ray.lock` (the launcher's tests start Ray clusters too).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from alerts.prometheus import config, render
from exporter.contract import vllm, wire
from exporter.framework.catalog import CATALOG, MetricType
from exporter.framework.collector import load_collectors
from tests.conftest import REPO, RunningExporter, RunningPrometheus, binary, exporter_command, wait_until
from tests.ray_testcluster import FAST, RayCluster, start_cluster, start_exporter, start_prometheus, stop_process

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

JOB = REPO / "tests" / "data" / "ray" / "train_job.py"
RUN = "run-it"


@dataclass
class Scenario:
    cluster: RayCluster
    head: RunningExporter
    worker: RunningExporter
    prometheus: RunningPrometheus
    gpu_control: Path
    job_ids: dict[str, str] = field(default_factory=dict)  # submission id -> Ray job id
    while_running: dict[str, list[dict]] = field(default_factory=dict)  # name -> Prometheus result


def metadata(attempt: int) -> dict[str, str]:
    return {"raypulse.job_name": "it-train", "raypulse.run_id": RUN, "raypulse.attempt": str(attempt),
            "raypulse.max_attempts": "2", "raypulse.workspace": "ws-it", "raypulse.user": "tester",
            "raypulse.label.team": "ml"}


def query(prometheus: RunningPrometheus, promql: str) -> list[dict]:
    return prometheus.query(promql)


def wait_query(prometheus: RunningPrometheus, promql: str, what: str, count: int = 1, timeout: float = 90) -> list:
    wait_until(lambda: len(query(prometheus, promql)) >= count, timeout, what, interval=0.5)
    return query(prometheus, promql)


def suffix(exporter: RunningExporter) -> str:
    """The end of the exporter's scrape target (`instance` is the Ray node's address, then this)."""
    return ":" + exporter.url.rsplit(":", 1)[1]


def by(results: list[dict], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in results}


@pytest.fixture(scope="module")
def scenario():
    base = Path(tempfile.mkdtemp(prefix="rpt-", dir="/tmp"))  # short: Ray's socket paths must stay < 108 bytes
    cluster = start_cluster(base / "ray", worker_cpus=(2,), head_cpus=0)
    started: list[subprocess.Popen] = []
    try:
        exporters = []
        gpu_control = base / "gpus.json"
        for node in (cluster.head, cluster.workers[0]):
            # The worker node has two simulated GPUs; the test makes the actors their users.
            gpus = ["--simulate-gpus", "2", "--gpu-control", str(gpu_control)] if not node.head else []
            exporter = start_exporter(base, node.exporter_port, "--progress-listen", f"127.0.0.1:{node.progress_port}",
                                      "--cluster", "it", *gpus, env={**cluster.env(), **FAST}, host="0.0.0.0")
            started.append(exporter.process)
            exporters.append(exporter)
        head, worker = exporters
        (base / "prometheus").mkdir()
        process, prometheus = start_prometheus(base / "prometheus", render(config(
            sd_url=f"http://127.0.0.1:{cluster.head.exporter_port}{wire.SD_PATH}", scrape_interval="1s", rules=[])))
        started.append(process)
        scenario = Scenario(cluster, head, worker, prometheus, gpu_control)
        run_the_jobs(scenario, stop_file=base / "stop")
        yield scenario
    finally:
        for process in started:
            stop_process(process)
        cluster.kill()
        shutil.rmtree(base, ignore_errors=True)


def run_the_jobs(s: Scenario, stop_file: Path) -> None:
    entrypoint = f"{sys.executable} {JOB} {stop_file}"
    s.cluster.submit(entrypoint, f"{RUN}-1", metadata(1))
    s.cluster.wait_job(f"{RUN}-1", {"FAILED", "SUCCEEDED"})
    s.cluster.submit(f"{sys.executable} -c \"print('hello')\"", "plain-it")  # plain `ray job submit`: no metadata
    s.cluster.submit(entrypoint, f"{RUN}-2", metadata(2))
    s.cluster.wait_job(f"{RUN}-2", {"RUNNING"})
    p = s.prometheus
    wait_query(p, f'raypulse_train_step{{submission_id="{RUN}-2"}} > 3', "progress of both ranks", count=2)
    wait_query(p, f'raypulse_job_actors{{submission_id="{RUN}-2", state="ALIVE"}} == 2', "two alive actors")
    cpu = (f'rate(raypulse_job_process_cpu_seconds_total{{submission_id="{RUN}-2", process_role="actor", '
           f'actor_class="Trainer"}}[5s])')
    # Growing, not by how much: the busy loops' share of 2 cores is the machine's load (0.18 beside make
    # test's other lanes), not what the exporter guarantees.
    wait_query(p, f"{cpu} > 0", "the actors' CPU use")
    wait_query(p, f'raypulse_job_processes{{submission_id="{RUN}-2", process_role="driver", job_id!=""}}',
               "the driver's Ray job id (it connects after it starts)")
    # Ray's resource view (the head collector reads its cluster status) catches up with the actors a
    # few seconds later, more on a busy machine: wait for it rather than read it at a moment.
    wait_query(p, 'raypulse_ray_resource_used{resource="CPU"} == 2', "the actors' CPUs in Ray's resource view")
    use_gpus(s, f"{RUN}-2")
    running = vllm.through_ray(vllm.REQUESTS_RUNNING)
    vllm_running = f'{running}{{job="{wire.RAY_METRICS_JOB}", cluster="it", model_name="tiny"}}'
    wait_query(p, vllm_running, "the actors' vLLM-named gauges, through Ray's metrics agents and /sd/ray", count=2)
    s.while_running = {
        "vllm": query(p, vllm_running),
        "cpu": query(p, cpu),
        "actor_memory": query(p, f'raypulse_job_process_resident_memory_bytes{{submission_id="{RUN}-2", '
                                 f'process_role="actor"}}'),
        "driver_memory": query(p, f'raypulse_job_process_resident_memory_bytes{{submission_id="{RUN}-2", '
                                  f'process_role="driver"}} > 0'),
        "state": query(p, f'raypulse_job_state{{submission_id="{RUN}-2"}} == 1'),
        "samples_rate": query(p, f'rate(raypulse_train_samples_total{{submission_id="{RUN}-2"}}[5s])'),
        "log_silence": query(p, f'time() - raypulse_job_driver_log_last_write_time_seconds{{submission_id="{RUN}-2"}}'),
        "resources_used": query(p, 'raypulse_ray_resource_used{resource="CPU"}'),
        "gpu_memory": query(p, f'raypulse_job_gpu_memory_used_bytes{{submission_id="{RUN}-2"}}'),
        "gpu_sm": query(p, f'raypulse_job_gpu_sm_utilization_ratio{{submission_id="{RUN}-2"}}'),
        "role_gpus": query(p, f'sum by (actor_role) (raypulse_job_role_gpus{{submission_id="{RUN}-2"}})'),
        "role_sm": query(p, f'avg by (actor_role) (raypulse_job_role_gpu_sm_utilization_ratio'
                            f'{{submission_id="{RUN}-2"}})'),
    }
    stop_file.touch()
    s.cluster.wait_job(f"{RUN}-2", {"SUCCEEDED", "FAILED"})
    wait_query(p, f'raypulse_job_state{{submission_id="{RUN}-2", state="SUCCEEDED"}} == 1', "the success")
    wait_query(p, f'raypulse_train_checkpoint_step{{submission_id="{RUN}-2"}}', "the driver's checkpoint")
    wait_query(p, 'raypulse_job_state{submission_id="plain-it", state="SUCCEEDED"} == 1', "the plain job")
    s.job_ids = {sid: s.cluster.job(sid)["job_id"] or "" for sid in (f"{RUN}-1", f"{RUN}-2", "plain-it")}


def use_gpus(s: Scenario, submission_id: str) -> None:
    """Make each actor of the job the user of one simulated GPU (by its real pid), as NVML would list it."""
    job_id = s.cluster.job(submission_id)["job_id"]
    actors = s.cluster.api(f"/api/v0/actors?limit=100&filter_keys=job_id&filter_predicates=%3D&filter_values={job_id}")
    pids = sorted(a["pid"] for a in actors["data"]["result"]["result"] if a["state"] == "ALIVE")
    assert len(pids) == 2
    for gpu, pid in enumerate(pids):
        result = subprocess.run(exporter_command("gpu-fault", "--control", str(s.gpu_control), "--gpu", str(gpu),
                                                 "process", str(pid), str(10240 + 2048 * gpu), "--sm", "0.5",
                                                 "--name", "python"),
                                capture_output=True, text=True, timeout=60, cwd=REPO)
        assert result.returncode == 0, result.stderr
    wait_query(s.prometheus, f'raypulse_job_gpu_memory_used_bytes{{submission_id="{submission_id}"}}',
               "GPU memory attributed to the job", count=2)


def test_the_failed_attempt_says_why(scenario):
    p, first = scenario.prometheus, f"{RUN}-1"
    assert by(query(p, f'raypulse_job_state{{submission_id="{first}"}} == 1'), "state") == {"FAILED": 1}
    errors = query(p, f'raypulse_job_error_info{{submission_id="{first}"}}')
    assert by(errors, "error_type") == {"JOB_ENTRYPOINT_COMMAND_ERROR": 1}
    assert by(query(p, f'raypulse_job_driver_exit_code{{submission_id="{first}"}}'), "job_id") == \
        {scenario.job_ids[first]: 1}
    failures = by(query(p, f'raypulse_job_task_failures{{submission_id="{first}"}}'), "error_type")
    assert failures.get("TASK_EXECUTION_EXCEPTION", 0) >= 1  # the actors' RuntimeError: the user's code


def test_both_attempts_of_the_run_are_joined_by_the_launchers_metadata(scenario):
    joined = query(scenario.prometheus, "raypulse_job_attempt * on(job_id, submission_id) group_left(run_id, "
                                        f'job_name, user, workspace) raypulse_job_info{{run_id="{RUN}"}}')
    assert {r["metric"]["submission_id"]: float(r["value"][1]) for r in joined} == {f"{RUN}-1": 1, f"{RUN}-2": 2}
    assert {(r["metric"]["job_name"], r["metric"]["user"], r["metric"]["workspace"]) for r in joined} == \
        {("it-train", "tester", "ws-it")}
    for submission, job_id in scenario.job_ids.items():
        if submission.startswith(RUN):
            assert by(query(scenario.prometheus, f'raypulse_job_info{{submission_id="{submission}"}}'), "job_id") \
                == {job_id: 1}
    labels = query(scenario.prometheus, f'raypulse_job_label_info{{submission_id="{RUN}-2"}}')
    assert [(r["metric"]["label_key"], r["metric"]["label_value"]) for r in labels] == [("team", "ml")]
    assert by(query(scenario.prometheus, f'raypulse_job_max_attempts{{submission_id="{RUN}-2"}}'), "job_id") == \
        {scenario.job_ids[f"{RUN}-2"]: 2}


def test_a_plain_job_is_exported_with_empty_launcher_labels(scenario):
    info = query(scenario.prometheus, 'raypulse_job_info{submission_id="plain-it"}')
    assert len(info) == 1
    assert all(info[0]["metric"].get(key, "") == "" for key in ("job_name", "run_id", "user", "workspace"))
    assert info[0]["metric"]["type"] == "SUBMISSION"
    assert query(scenario.prometheus, 'raypulse_job_attempt{submission_id="plain-it"}') == []


def test_the_actors_processes_are_mapped_to_the_job_with_cpu_and_memory(scenario):
    job_id = scenario.job_ids[f"{RUN}-2"]
    cpu = scenario.while_running["cpu"]
    assert len(cpu) == 1
    assert cpu[0]["metric"]["job_id"] == job_id
    assert cpu[0]["metric"]["instance"].endswith(suffix(scenario.worker))  # measured where the actors run
    assert 0 < float(cpu[0]["value"][1]) < 2.5  # two actors, one CPU each, busy-looping (at most 2 cores)
    assert sum(float(r["value"][1]) for r in scenario.while_running["actor_memory"]) > 20e6
    driver = scenario.while_running["driver_memory"]
    assert len(driver) == 1
    assert driver[0]["metric"]["job_id"] == job_id
    assert float(driver[0]["value"][1]) > 20e6
    assert by(scenario.while_running["state"], "state") == {"RUNNING": 1}
    assert by(scenario.while_running["resources_used"], "resource") == {"CPU": 2}
    assert float(scenario.while_running["log_silence"][0]["value"][1]) < 60


def test_training_progress_is_labelled_by_job_and_rank(scenario):
    p, second = scenario.prometheus, f"{RUN}-2"
    job_id = scenario.job_ids[second]
    steps = query(p, f'raypulse_train_step{{submission_id="{second}"}}')
    ranks = {r["metric"]["rank"] for r in steps if r["metric"]["instance"].endswith(suffix(scenario.worker))}
    assert ranks == {"0", "1"}
    assert {r["metric"]["job_id"] for r in steps} == {job_id}
    assert all(float(r["value"][1]) > 3 for r in scenario.while_running["samples_rate"])  # 64 samples / 0.2 s
    nan_losses = [r for r in query(p, f'raypulse_train_nonfinite_values_total{{submission_id="{second}", '
                                      'field="loss"}') if r["metric"]["instance"].endswith(suffix(scenario.worker))]
    assert by(nan_losses, "rank") == {"0": 1, "1": 1}  # the NaN at step 3, counted, not hidden
    loss = query(p, f'raypulse_train_loss{{submission_id="{second}"}}')
    assert all(0 < float(r["value"][1]) < 4 for r in loss)
    checkpoint = query(p, f'raypulse_train_checkpoint_step{{submission_id="{second}"}}')
    assert checkpoint[0]["metric"]["instance"].endswith(suffix(scenario.head))  # the driver runs on the head
    assert query(p, f'raypulse_train_last_progress_time_seconds{{submission_id="{second}"}} > time() - 300')


def test_gpu_use_is_attributed_to_the_job_through_the_gpu_collector(scenario):
    memory = scenario.while_running["gpu_memory"]
    assert {r["metric"]["gpu"]: float(r["value"][1]) for r in memory} == {"0": 10240 * 2**20, "1": 12288 * 2**20}
    assert {r["metric"]["job_id"] for r in memory} == {scenario.job_ids[f"{RUN}-2"]}
    assert all(r["metric"]["uuid"].startswith("GPU-") for r in memory)
    assert all(r["metric"]["instance"].endswith(suffix(scenario.worker)) for r in memory)
    assert {r["metric"]["gpu"]: float(r["value"][1]) for r in scenario.while_running["gpu_sm"]} == \
        {"0": pytest.approx(0.5), "1": pytest.approx(0.5)}
    # The actors' class is Trainer: both GPUs are the trainers' (ray.actor_roles), each half busy.
    assert by(scenario.while_running["role_gpus"], "actor_role") == {"trainer": 2}
    assert by(scenario.while_running["role_sm"], "actor_role") == {"trainer": pytest.approx(0.5)}


def test_job_times_are_ordered(scenario):
    p, second = scenario.prometheus, f"{RUN}-2"

    def value(family: str) -> float:
        return float(query(p, f'{family}{{submission_id="{second}"}}')[0]["value"][1])
    submitted, started, ended = (value("raypulse_job_submit_time_seconds"), value("raypulse_job_start_time_seconds"),
                                 value("raypulse_job_end_time_seconds"))
    assert submitted <= started <= ended <= time.time()
    assert value("raypulse_job_pending_seconds") == pytest.approx(started - submitted)
    assert value("raypulse_job_duration_seconds") == pytest.approx(ended - submitted)


def test_service_discovery_finds_every_nodes_exporter(scenario):
    active = scenario.prometheus.api("/api/v1/targets")["data"]["activeTargets"]
    targets = [t for t in active if t["labels"]["job"] != wire.RAY_METRICS_JOB]
    nodes = {n["node_id"]: n for n in scenario.cluster.api("/api/v0/nodes?limit=100")["data"]["result"]["result"]}
    assert len(targets) == 2
    # /sd/ray: each node's Ray metrics agent (and Ray's autoscaler and dashboard metrics), in the cluster.
    agents = [t for t in active if t["labels"]["job"] == wire.RAY_METRICS_JOB]
    assert len(agents) >= len(nodes)
    assert {t["labels"]["cluster"] for t in agents} == {"it"}
    for target in targets:
        labels = target["labels"]
        assert target["health"] == "up", target
        assert labels["cluster"] == "it"
        assert labels["role"] == ("head" if nodes[labels["ray_node_id"]]["is_head_node"] else "worker")
        exporter = scenario.head if labels["role"] == "head" else scenario.worker
        assert labels["instance"].endswith(suffix(exporter))
    nodes_up = query(scenario.prometheus, "raypulse_ray_nodes{state='ALIVE'}")
    assert by(nodes_up, "role") == {"head": 2}  # the head exporter's view of the cluster, from its target


def test_a_gauge_named_as_vllm_names_it_reaches_prometheus_through_rays_metrics_agents(scenario):
    # Each actor set its engine's gauge; Prometheus found the agents at the head's /sd/ray (job "ray").
    found = scenario.while_running["vllm"]
    assert {(r["metric"]["engine"], float(r["value"][1])) for r in found} == {("0", 3.0), ("1", 4.0)}


def test_exposition_with_ray_series_is_clean_and_matches_the_catalog(scenario):
    load_collectors()
    for exporter in (scenario.head, scenario.worker):
        text = exporter.metrics_text()
        result = subprocess.run([binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                                timeout=60)
        assert result.stdout + result.stderr == ""
        for family in text_string_to_metric_families(text):
            name = family.name + ("_total" if family.type == "counter" else "")
            spec = CATALOG.get(name)
            assert spec is not None, name
            assert family.type == ("gauge" if spec.type is MetricType.INFO else spec.type.value), name
            assert {frozenset(s.labels) for s in family.samples} <= {frozenset(spec.labels)}, name
        up = {s.labels["collector"]: s.value for f in text_string_to_metric_families(text)
              if f.name == "raypulse_exporter_collector_up" for s in f.samples}
        assert up["ray"] == up["ray_head"] == up["ray_processes"] == up["train"] == 1
