"""Every dashboard query on live data: a real Ray cluster started by the launcher (a head, a GPU
worker with three simulated B200s, a spare worker that is stopped to leave a dead node), one
exporter per node, a training job whose first attempt fails and whose retry reports progress,
two more exporters simulating older boards (a V100 and an RTX 6000 Ada, for the families a B200
lacks), GPU faults injected through the simulator, the alert rules of alerts/rules loaded, and
a real Prometheus scraping it all through the head exporter's /sd.

Every target of every committed dashboard, variables filled in (cluster = this cluster, the rest
All), runs as a range query and must return data; the only exceptions are families this host
cannot have (no InfiniBand adapter, no cgroup limits, ...), and only while Prometheus has never
seen them. The counts of panels and queries checked are printed.

Run under `flock /tmp/raypulse-ray.lock` (other tests start Ray clusters too).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import launcher
from alerts import prometheus
from dashboards import livecheck
from exporter.contract import node_exporter, vllm, wire
from exporter.gpusim import control
from scripts.ports import free_port_range
from tests.conftest import REPO, exporter_command, free_port, http_get, wait_until
from tests.otlp_receiver import OtlpReceiver
from tests.ray_testcluster import FAST, start_prometheus, stop_process

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

# Families this machine cannot produce, and why; a query reading one may come back empty only
# while Prometheus has never seen the family (on a host that has it, the query must return data).
NOT_ON_THIS_HOST = {
    **{f"raypulse_node_infiniband_{name}": "no InfiniBand or RoCE adapter" for name in (
        "excessive_buffer_overrun_errors_total", "hw_counter_total", "link_downed_total",
        "link_error_recovery_total", "local_link_integrity_errors_total", "port_info", "port_physical_state",
        "port_rate_bytes_per_second", "port_state", "receive_bytes_total", "receive_errors_total",
        "receive_packets_total", "receive_remote_physical_errors_total", "symbol_errors_total",
        "transmit_bytes_total", "transmit_discards_total", "transmit_packets_total", "transmit_wait_total")},
    "raypulse_node_memory_hardware_corrupted_bytes": "kernel without memory-failure handling",
    "raypulse_gpu_pod_resources_up": "no kubelet's pod-resources socket (not a Kubernetes node)",
    "raypulse_node_network_speed_bytes_per_second": "only virtual interfaces (no link speed)",
    "raypulse_pod_cpu_limit": "the test's cgroup has no CPU limit",
    "raypulse_pod_memory_limit_bytes": "the test's cgroup has no memory limit",
    "raypulse_pod_pids": "no pids controller for the test's cgroup",
    "raypulse_pod_pids_limit": "the test's cgroup has no pids limit",
    "raypulse_pod_cpu_periods_total": "the cpu controller enforces no periods here",
    "raypulse_pod_cpu_throttled_periods_total": "the cpu controller enforces no periods here",
    "raypulse_pod_cpu_throttled_seconds_total": "the cpu controller enforces no periods here",
    "raypulse_pod_io_read_bytes_total": "no io controller for the test's cgroup",
    "raypulse_pod_io_written_bytes_total": "no io controller for the test's cgroup",
    "raypulse_pod_memory_peak_bytes": "cgroup v2 on a kernel before 5.19",
    "raypulse_pod_memory_swap_bytes": "no swap accounting",
    "raypulse_pod_pressure_stalled_seconds_total": "no PSI for the test's cgroup",
    "raypulse_pod_pressure_waiting_seconds_total": "no PSI for the test's cgroup",
    "raypulse_node_pressure_stalled_seconds_total": "kernel without PSI",
    "raypulse_node_pressure_waiting_seconds_total": "kernel without PSI",
}

# The staged job: two GPU actors in a placement group that register their processes with the
# GPU simulator (as CUDA would make them appear in NVML), print, report progress and timed
# checkpoints, and report as a vLLM engine inside Ray does; attempt 1 fails at step 5, attempt 2
# reports a NaN loss at step 3 (the launcher's health watcher stops it and heals the run: the
# Healing panels), attempt 3 runs until the stop file appears.
JOB = r'''
import json, math, os, sys, time
from pathlib import Path
import ray
from ray.util.metrics import Counter, Gauge, Histogram
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from exporter import progress
from exporter.contract import vllm
from exporter.gpusim import control

attempt = int(os.environ.get("RAYPULSE_ATTEMPT", "1"))
stop_file = sys.argv[1]


@ray.remote(num_cpus=1, num_gpus=1)
class Trainer:
    def __init__(self, rank):
        self.rank = rank
        gpu = int(ray.get_gpu_ids()[0])
        path = Path(os.environ["RAYPULSE_EXPORTER_GPU__CONTROL_FILE"])
        process = control.Process(pid=os.getpid(), memory_bytes=(20 + rank) << 30, sm_utilization=0.8,
                                  name="ray::Trainer")
        control.update(path, lambda c: control.gpu_entry(c, gpu).processes.append(process))
        print(f"trainer {rank} on GPU {gpu}", flush=True)  # the workers' output: the output panels
        # What a vLLM engine inside Ray reports through ray.util.metrics: the RL board's rollout-engine row.
        keys, self.engine = ("model_name", "engine"), {"model_name": "tiny", "engine": str(rank)}
        self.running, self.waiting, self.kv_cache = (Gauge(vllm.registered(name), "", tag_keys=keys) for name in (
            vllm.REQUESTS_RUNNING, vllm.REQUESTS_WAITING, vllm.KV_CACHE_USAGE))
        self.preempted, self.generated = (Counter(vllm.registered(name), "", tag_keys=keys) for name in (
            vllm.PREEMPTIONS, vllm.GENERATION_TOKENS))
        self.first_token = Histogram(vllm.registered(vllm.TIME_TO_FIRST_TOKEN), "", boundaries=[0.01, 0.1, 1.0],
                                     tag_keys=keys)

    def train(self, fail_at, stop_file):
        loss = 4.0
        for step in range(1, 100_000):
            with progress.phase("generate", rank=self.rank):  # an RL loop's phases: the RL board
                time.sleep(0.2)
            loss *= 0.97
            self.running.set(4, tags=self.engine)
            self.waiting.set(step % 3, tags=self.engine)
            self.kv_cache.set(0.5, tags=self.engine)
            self.preempted.inc(1, tags=self.engine)
            self.generated.inc(2048, tags=self.engine)
            self.first_token.observe(0.05, tags=self.engine)
            if self.rank == 0:
                progress.report_iteration(step, rollouts=8, generated_tokens=4096, reward_mean=1 - loss / 4,
                                          reward_std=0.1, rewards={"format": 0.9}, kl=0.01, entropy=1.0,
                                          response_length_mean=300, response_length_max=512,
                                          response_length_limit=512, truncated_ratio=0.05,
                                          weight_sync_seconds=0.01, weight_sync_bytes=2**20, rank=0)
            progress.report(step, loss=math.nan if step == 3 and attempt == 2 else loss, samples=64, tokens=8192,
                            learning_rate=1e-3, grad_norm=1.5, rank=self.rank)
            if step % 5 == 0:
                progress.checkpoint_saved(step, rank=self.rank, seconds=0.05)
                print(f"trainer {self.rank} step {step}", flush=True)
            if step == fail_at:
                raise RuntimeError("simulated failure")
            if os.path.exists(stop_file):
                break
        progress.flush(5)
        return step


ray.init()
group = placement_group([{"CPU": 1, "GPU": 1}] * 2)
ray.get(group.ready())
trainers = [Trainer.options(scheduling_strategy=PlacementGroupSchedulingStrategy(group)).remote(rank)
            for rank in range(2)]
print("trained", ray.get([t.train.remote(5 if attempt == 1 else None, stop_file) for t in trainers]))
'''



@dataclass
class Scenario:
    prometheus: str
    cluster: str
    results: list[livecheck.Result]


def query(prometheus: str, promql: str) -> list[dict]:
    from urllib.parse import quote

    status, _, body = http_get(f"{prometheus}/api/v1/query?query={quote(promql)}")
    assert status == 200, body
    return json.loads(body)["data"]["result"]


def wait_for(prometheus: str, promql: str, what: str, timeout: float = 120) -> None:
    wait_until(lambda: len(query(prometheus, promql)) > 0, timeout, what, interval=0.5)


def extra_exporter(base: Path, name: str, model: str, *args: str, env: dict[str, str] | None = None
                   ) -> tuple[subprocess.Popen, int, Path]:
    """A standalone exporter simulating one GPU of `model` (older boards have families a B200 lacks)."""
    port, gpus = free_port(), base / f"{name}.json"
    log = base / f"exporter-{name}.log"
    process = subprocess.Popen(
        exporter_command("serve", "--listen", f"127.0.0.1:{port}", "--simulate-gpus", "1", "--gpu-control", str(gpus),
                         "--progress-listen", "off", "--ray-dashboard", f"http://127.0.0.1:{free_port()}", *args),
        stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO,
        env={**os.environ, "RAYPULSE_EXPORTER_GPU__SIMULATE_MODEL": model, **FAST, **(env or {})})
    return process, port, gpus


def stage_gpu_faults(path: Path) -> None:
    """XID 94 (uncorrectable ECC, row remap pending, reset asked) and a down NVLink on GPU 1,
    thermal throttling on GPU 0, MIG and a failing NVML call on the idle GPU 2."""
    control.update(path, lambda c: control.inject_xid(control.gpu_entry(c, 1), 94))
    control.update(path, lambda c: setattr(control.gpu_entry(c, 1), "nvlink_down", [3]))
    control.update(path, lambda c: setattr(control.gpu_entry(c, 0), "thermal_throttle", True))
    control.update(path, lambda c: setattr(control.gpu_entry(c, 2), "mig", ["3g.90gb", "3g.90gb"]))
    control.update(path, lambda c: control.gpu_entry(c, 2).errors.update(
        {"nvmlDeviceGetEnforcedPowerLimit": "UNKNOWN"}))


def submit_pending_job(address: str, token: str) -> None:
    """A plain Jobs API submission whose entrypoint asks for a CPU and a GPU that are all taken:
    it stays PENDING (the pending-time and PENDING-state series)."""
    body = json.dumps({"entrypoint": "sleep 600", "submission_id": "dash-live-pending",
                       "entrypoint_num_cpus": 1, "entrypoint_num_gpus": 1}).encode()
    request = urllib.request.Request(f"{address}/api/jobs/", data=body, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def prometheus_config(head_exporter: str, cluster: str, extras: dict[str, int]) -> str:
    """The head's /sd, and the standalone exporters as fixed targets labelled like the nodes."""
    standalone = [(f"127.0.0.1:{port}", {"cluster": cluster, "node": name, "role": "standalone"})
                  for name, port in extras.items()]
    return prometheus.render(prometheus.config(sd_url=head_exporter + wire.SD_PATH, targets=standalone,
                                               scrape_interval="1s"))


@pytest.fixture(scope="module")
def scenario() -> Iterator[Scenario]:
    base = Path(tempfile.mkdtemp(prefix="rpd-", dir="/tmp"))  # short: Ray's socket paths must stay < 108 bytes
    gpus = base / "gpus.json"
    work = base / "job"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    stop_file = base / "stop"
    started: list[subprocess.Popen] = []
    receiver = OtlpReceiver().start()
    handle = supervisor = None
    with pytest.MonkeyPatch.context() as patch:
        # What the launcher hands to every node and exporter it starts (it passes its environment on).
        for key, value in {"RAYPULSE_HOME": str(base / "home"), "RAYPULSE_EXPORTER_GPU__CONTROL_FILE": str(gpus),
                           "RAYPULSE_EXPORTER_GPU__SIMULATE_MODEL": "B200", **FAST}.items():
            patch.setenv(key, value)
        try:
            control.update(base / "v100.json", lambda c: setattr(c, "init_error", "DRIVER_NOT_LOADED"))
            control.update(base / "v100.json", lambda c: c.errors.update({"nvmlEventSetWait_v2": "UNKNOWN"}))
            v100, v100_port, v100_control = extra_exporter(base, "v100", "V100")
            rtx, rtx_port, _ = extra_exporter(base, "rtx", "RTX6000ADA", "--otlp-endpoint", receiver.url,
                                              env={"RAYPULSE_EXPORTER_OTLP__INTERVAL_SECONDS": "2"})
            started += [v100, rtx]
            base_port = free_port_range(6)  # three nodes at base + 2i, below the ephemeral ports clients get
            handle = launcher.submit({
                "name": "dash-live", "entrypoint": f"python job.py {stop_file}", "working_dir": str(work),
                "worker_groups": [{"name": "gpu", "count": 1, "cpus": 2, "gpus": 3},
                                  {"name": "spare", "count": 1, "cpus": 1}],
                "simulate_gpus": True, "max_retries": 2, "retry_backoff_seconds": 1,
                # The NaN heals; the staged GPU faults and the killed spare node are only reported.
                "health": {"check_interval_seconds": 1, "on_gpu_fault": "report", "on_node_lost": "report",
                           "on_hang": "report"},
                "labels": {"team": "ml"}, "exporter_port": base_port, "progress_port": base_port + 1,
            })
            supervisor = threading.Thread(target=handle.wait, daemon=True)  # runs the retry
            supervisor.start()
            record = handle.cluster
            head = next(e.url for e in record.exporters if e.role == "head")
            spare = next(p for p in record.processes if p.node.startswith("spare") and p.role != "exporter")
            os.kill(spare.pid, signal.SIGTERM)  # a Ray node that died: the dead-node panels
            (base / "prometheus").mkdir()
            process, prometheus = start_prometheus(base / "prometheus", prometheus_config(
                head, record.name, {"sim-v100": v100_port, "sim-rtx": rtx_port}))
            started.append(process)
            url = prometheus.url
            wait_for(url, "raypulse_gpu_nvml_init_failures_total", "the V100 exporter's failed NVML init")
            control.update(v100_control, lambda c: setattr(c, "init_error", None))
            run = handle.run_id
            wait_for(url, f'raypulse_job_state{{submission_id="{run}-a3", state="RUNNING"}} == 1', "attempt 3 running",
                     timeout=240)
            wait_for(url, f'raypulse_job_gpu_processes{{submission_id="{run}-a3"}}', "the actors on the GPUs")
            stage_gpu_faults(gpus)
            submit_pending_job(record.address, Path(record.token_path).read_text().strip())
            for promql in (f'raypulse_train_checkpoint_step{{submission_id="{run}-a3"}}', "raypulse_job_error_info",
                           f'raypulse_run_recoveries_total{{run_id="{run}"}}',
                           "raypulse_job_output_last_write_time_seconds",
                           'raypulse_gpu_xid_errors_total{xid="94"}', "raypulse_gpu_mig_dram_active_ratio",
                           'raypulse_gpu_clock_event_active{reason="hw_thermal_slowdown"} == 1',
                           "raypulse_gpu_nvml_errors_total", 'raypulse_gpu_nvml_up{node="sim-v100"} == 1',
                           "raypulse_gpu_event_watcher_errors_total",
                           "raypulse_exporter_otlp_last_success_timestamp_seconds", "raypulse_ray_node_death_reason",
                           'ALERTS{alertstate="firing", scope="gpu"}',
                           vllm.through_ray(vllm.TIME_TO_FIRST_TOKEN, "_bucket"),  # Ray's agents: /sd/ray
                           'ALERTS{scope=~"training|job"}'):
                wait_for(url, promql, promql)
            yield Scenario(url, record.name, settled(url, record.name))
        finally:
            stop_file.touch()
            if handle is not None:
                handle.stop()
                if supervisor is not None:
                    supervisor.join(60)
                handle.close()
            for process in started:
                stop_process(process)
            shutil.rmtree(base, ignore_errors=True)


def ours_absent(result: livecheck.Result) -> set[str]:
    """The families a query reads that Prometheus never saw, node_exporter's aside: no node_exporter runs
    here (tests/test_dashboards_node_exporter.py checks that side)."""
    return set(result.absent) - set(node_exporter.FAMILIES)


def not_here(result: livecheck.Result) -> bool:
    """An empty query that reads only families this host cannot have (NOT_ON_THIS_HOST)."""
    return not result.series and bool(ours_absent(result)) and ours_absent(result) <= set(NOT_ON_THIS_HOST)


def failing(results: list[livecheck.Result]) -> list[livecheck.Result]:
    """The queries that erred, or returned nothing that this host could have given them."""
    return [r for r in results if r.error or (not r.series and not not_here(r))]


def settled(url: str, cluster: str, timeout: float = 90.0) -> list[livecheck.Result]:
    """Every dashboard query of the cluster, once none fails: a rate needs two scrapes within its interval
    after its series appeared, so this polls instead of sleeping; at the deadline, the results as they stand
    (the tests then name what stayed empty)."""
    deadline = time.monotonic() + timeout
    while True:
        results = livecheck.run(url, {"cluster": cluster}, window=240, step=2, rate_interval="6s")
        if not failing(results) or time.monotonic() > deadline:
            return results
        time.sleep(2)


def test_every_dashboard_query_returns_data(scenario, capsys):
    results = scenario.results
    empty = [r for r in results if not r.series]
    absent_here = [r for r in empty if not_here(r)]
    panels = {(r.dashboard, r.panel) for r in results}
    with capsys.disabled():  # the counts belong in the test log, passed or not
        print("\n" + livecheck.summary(results))
        print(f"live check: {len(panels)} panels, {len(results)} queries; {len(results) - len(empty)} returned data; "
              f"{len(absent_here)} read only families this host cannot have: "
              + ", ".join(sorted({f"{f} ({NOT_ON_THIS_HOST[f]})" for r in absent_here for f in ours_absent(r)})))
    assert not [r for r in results if r.error], [f"{r.name}: {r.error}" for r in results if r.error]
    without_data = [r for r in empty if r not in absent_here]
    assert not without_data, "panels without data:\n" + "\n".join(f"{r.name}: {r.expr} absent={r.absent}"
                                                                  for r in without_data)


def test_a_variable_narrows_the_queries(scenario):
    """Filled in with one GPU node, the GPU dashboard's queries return that node's series only."""
    narrowed = livecheck.run(scenario.prometheus, {"cluster": scenario.cluster, "node": "sim-rtx"}, window=60,
                             step=2, rate_interval="6s")
    gpu_utilization = next(r for r in narrowed if r.dashboard == "raypulse-gpu" and r.panel == "Utilization")
    assert gpu_utilization.series == 1
    everything = next(r for r in scenario.results if r.dashboard == "raypulse-gpu" and r.panel == "Utilization")
    assert everything.series > 1
    # The recorded per-job series (alerts/rules/scale.yaml) follow $submission too: one series for one job.
    submission = query(scenario.prometheus, "cluster_job:raypulse_job_gpus:count")[0]["metric"]["submission_id"]
    one_job = livecheck.run(scenario.prometheus, {"cluster": scenario.cluster, "submission": submission}, window=60,
                            step=2, rate_interval="6s", keep=lambda expr: "cluster_job:" in expr)
    assert len(one_job) >= 4
    assert all(r.series == 1 for r in one_job), [(r.name, r.series) for r in one_job]
