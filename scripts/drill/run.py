"""Run the fault drill: a real local Ray cluster (launcher), exporters with simulated GPUs, a real
Prometheus and Alertmanager with the drill variant of the rules, a real webhook receiver; a
healthy run that must raise nothing, then every fault of scripts/drill/faults.py, one by one.

Must be run under `flock /tmp/raypulse-ray.lock` (it starts Ray). `python -m scripts.drill --help`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from alerts import build
from alerts.config import DEFAULT, Config
from exporter.contract import wire
from scripts import stack
from scripts.drill.faults import QUICK, Context, Expect, Fault, catalog
from scripts.ports import free_port, free_port_range
from scripts.webhook import Received, Webhook

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "job.py"
SCALE = 1 / 30  # every `for`, window and age of alerts/config.py, e.g. for: 5m -> 10s (Config.scaled)
# A node cut off is news within seconds here: RaypulseExporterDown's `for` as before kps' 10m (2 s at SCALE).
FAST_FORS = {"RaypulseExporterDown": "1m"}
SCRAPE_SECONDS = 1  # scrape and rule evaluation interval
# Alertmanager's group_wait and group_interval in the drills (alerts/alertmanager.yml's 30s and 5m; other
# tests' `fast` stack: 1s): a new alert leaves Alertmanager within 0.1 s, not up to 1 s, of reaching it.
GROUPING = "100ms"
SLACK_SECONDS = 8.0  # Alertmanager's group_wait (GROUPING; 1 s when this was set), delivery, and a busy 2-core machine
GPU_WORKER, CPU_WORKER, SPARE = "gpu-1", "cpu-1", "spare"
SIMULATED_GPUS = 16
# The collectors the drill's faults go through run every 1-2 s (5 s by default).
COLLECTOR_INTERVALS = {"gpu": 1, "gpu_events": 1, "train": 1, "ray": 2, "ray_head": 2, "ray_processes": 2}
# Ray's GCS declares a node dead after 5 failed health checks 1 s apart (defaults: 3 s, 5, 10 s timeout).
RAY_HEALTH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
              "RAY_health_check_failure_threshold": "5", "RAY_health_check_initial_delay_ms": "1000"}


@dataclass
class Outcome:
    fault: str
    injected: str
    expected: str
    budget: float
    received: dict[str, str] | None = None
    latency: float | None = None
    expected_labels: dict[str, str] = field(default_factory=dict)  # what the received alert must carry

    @property
    def ok(self) -> bool:
        return self.latency is not None and self.latency <= self.budget


@dataclass
class Report:
    quick: bool
    scale: float
    healthy_seconds: float
    outcomes: list[Outcome] = field(default_factory=list)
    healthy_alerts: list[dict] = field(default_factory=list)
    false_alarms: list[dict] = field(default_factory=list)
    wall_seconds: float = 0.0
    started: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.outcomes) and all(o.ok for o in self.outcomes) and not self.false_alarms \
            and not self.healthy_alerts


def drill_config() -> Config:
    """The rules the drill runs: the Watchdog among them (no kube-prometheus-stack here), FAST_FORS, at SCALE.
    tests/test_two_hosts.py runs the same."""
    return replace(DEFAULT, watchdog=True).with_fors(FAST_FORS).scaled(SCALE)


def budget(expect: Expect, fault: Fault) -> float:
    """scrape + evaluation interval + the alert's scaled `for` + the source's own delay + slack."""
    for_ = drill_config().tune(expect.alertname).for_.seconds
    return 2 * SCRAPE_SECONDS + for_ + fault.source_delay + SLACK_SECONDS


def _exporter_env(gpu_control: Path) -> dict[str, str]:
    env = {wire.ENV_GPU_CONTROL_FILE: str(gpu_control), **RAY_HEALTH}
    for name, seconds in COLLECTOR_INTERVALS.items():
        env[f"{wire.ENV_EXPORTER_PREFIX}COLLECTORS__{name.upper()}__INTERVAL_SECONDS"] = str(seconds)
        env[f"{wire.ENV_EXPORTER_PREFIX}COLLECTORS__{name.upper()}__DEADLINE_SECONDS"] = "5"
    return env


def _ports(nodes: int) -> dict[str, int]:
    """Exporter and progress base ports with room for every node (node i: base + 2i and base + 1 + 2i)."""
    base = free_port_range(2 * nodes)
    return {"exporter_port": base, "progress_port": base + 1}


def _wait(what: str, predicate, timeout: float, interval: float = 0.1):
    """`predicate()`'s first truthy result, asked every `interval` s (files and local Prometheus queries: cheap)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
            result = predicate()
            if result:
                return result
        time.sleep(interval)
    raise TimeoutError(f"drill: timed out after {timeout:g}s waiting for {what}")


class Spare:
    """A standalone exporter with simulated GPUs (faults that take all of NVML down go there)."""

    def __init__(self, workdir: Path, cluster: str, control: Path) -> None:
        self.port, self.workdir, self.cluster, self.control = free_port(), workdir, cluster, control
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{self.port}",
                   "--simulate-gpus", "2", "--gpu-control", str(self.control), "--progress-listen", "off",
                   "--cluster", self.cluster]
        log = (self.workdir / "exporter-spare.log").open("ab")
        self.process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


def _relabel(exporters) -> list[dict]:
    """Every node of a one-host cluster has the same Ray node name (its IP), so /sd gives them all
    the same `node` label: name each as the launcher does, matched by its exporter's port."""
    return [{"source_labels": ["__address__"], "regex": rf".*:{ref.url.rsplit(':', 1)[1]}", "target_label": "node",
             "replacement": ref.node} for ref in exporters]


def run(quick: bool = False, healthy_seconds: float = 240.0, workdir: Path | None = None,
        log=print) -> Report:
    import launcher
    from exporter.gpusim import control
    from launcher.health.policy import FaultClass
    from launcher.run import submission_id

    started = time.monotonic()
    workdir = workdir or Path(tempfile.mkdtemp(prefix="raypulse-drill-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = Report(quick=quick, scale=SCALE, healthy_seconds=healthy_seconds,
                    started=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    gpu_control, spare_control, job_control = (workdir / "gpu-1.json", workdir / "spare.json", workdir / "job.json")
    os.environ[wire.ENV_HOME] = str(workdir / "launcher-home")  # the drill's cluster stays out of ~/.raypulse
    os.environ.update(_exporter_env(gpu_control))  # inherited by the launcher's nodes and exporters
    rules = workdir / "rules"
    build.write_rules(rules, drill_config())
    spec = {"name": "drill", "simulate_gpus": True,
            "entrypoint": f"python {JOB} --control {job_control} --ranks 2 --gpu-rank",
            **_ports(3),
            # The launcher's health watcher sees the same faults (a NaN loss, an XID) and would stop the
            # attempt before a later fault is injected: here it only reports, the alerts are under test.
            "health": {f"on_{fault.value}": "report" for fault in FaultClass},
            "worker_groups": [{"name": "gpu", "count": 1, "cpus": 1, "gpus": SIMULATED_GPUS},
                              {"name": "cpu", "count": 1, "cpus": 1}]}
    with contextlib.ExitStack() as cleanup:
        log(f"drill: starting a cluster (head, {GPU_WORKER} with {SIMULATED_GPUS} simulated GPUs, {CPU_WORKER}) "
            "and the training job")
        # `launcher submit --keep-cluster`: the cluster outlives the job, for the node faults at the end.
        handle = launcher.submit({**spec, "keep_cluster": True, "max_retries": 0})
        name = handle.run_id  # the cluster's name and `cluster` label
        cleanup.callback(launcher.down, name)
        # Supervise the run as `launcher submit` does: it starts the exporters once the job runs.
        threading.Thread(target=handle.wait, name="run-supervisor", daemon=True).start()
        record = handle.cluster
        sid = submission_id(handle.run_id, 1)
        spare = Spare(workdir, name, spare_control)
        spare.start()
        cleanup.callback(spare.stop)
        hook = cleanup.enter_context(Webhook())
        alerting = cleanup.enter_context(stack.start(
            workdir / "stack", sd_url=record.exporters[0].url + wire.SD_PATH, targets=[f"127.0.0.1:{spare.port}"],
            labels={"cluster": name, "node": SPARE}, webhook_url=hook.url, rules_dir=rules,
            scrape_interval=f"{SCRAPE_SECONDS}s", evaluation_interval=f"{SCRAPE_SECONDS}s", fast=True,
            grouping=GROUPING, relabel_configs=_relabel(record.exporters)))
        watch_from = time.time()
        try:
            _wait("4 exporters scraped", lambda: alerting.query('count(up{job="raypulse"} == 1) == 4'), 120)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; Prometheus's targets: {alerting.targets()}") from None
        log(f"drill: Prometheus {alerting.prometheus_url} scrapes 4 exporters; job {sid} submitted")
        ranks = _wait("the job's ranks", lambda: json.loads(job_control.with_suffix(".ranks.json").read_text()), 180)
        rank0 = next(r for r in ranks if r["rank"] == 0)
        job_gpu = rank0["gpu_ids"][0]
        # Tie the job to its GPU: NVML lists rank 0's process on it (as a real CUDA process would be).
        control.update(gpu_control, lambda c: control.gpu_entry(c, job_gpu).processes.append(
            control.Process(pid=rank0["pid"], memory_bytes=20 << 30, name="ray::Rank")))
        _wait("training progress in Prometheus",
              lambda: alerting.query(f'count(raypulse_train_step{{submission_id="{sid}"}}) == 2'), 120)
        with contextlib.suppress(TimeoutError):
            _wait("the job's GPU use", lambda: alerting.query(
                f'raypulse_job_gpu_sm_utilization_ratio{{submission_id="{sid}"}}'), 60)
        log(f"drill: job {sid} trains on 2 ranks (rank 0 on GPU {job_gpu}); healthy run for {healthy_seconds:g}s")
        time.sleep(healthy_seconds)
        healthy = [a for a in hook.snapshot() if a.status == "firing" and a.name != "RaypulseWatchdog"]
        report.healthy_alerts = [_describe(a) for a in healthy]
        assert any(a.name == "RaypulseWatchdog" for a in hook.snapshot()), "the Watchdog never arrived"

        ctx = Context(cluster=name, gpu_node=GPU_WORKER, cpu_node=CPU_WORKER, spare_node=SPARE,
                      gpu_control=gpu_control, spare_control=spare_control, job_control=job_control,
                      submission_id=sid, job_gpu=job_gpu,
                      free_gpus=[i for i in range(SIMULATED_GPUS) if i != job_gpu],
                      cluster_processes=list(launcher_processes(name)), restart_spare=spare.restart,
                      stall_age=drill_config().tune("RaypulseTrainingStalled").age.seconds)
        faults = [fault for fault in catalog(ctx) if not quick or fault.key in QUICK]
        injected = inject_each(faults, hook, budget, report.outcomes, lambda text: log(f"drill: {text}"))
        received = hook.snapshot()
        report.false_alarms = [_describe(a) for a in received
                               if a.status == "firing" and a.name != "RaypulseWatchdog" and a.at >= watch_from
                               and not _explained(a, injected)]
    report.wall_seconds = round(time.monotonic() - started, 1)
    return report


def inject_each(faults: list[Fault], hook: Webhook, budget_of: Callable[[Expect, Fault], float],
                outcomes: list[Outcome], log: Callable[[str], None], settle: float = 0.0) -> list[tuple[float, Fault]]:
    """Inject each fault in turn and wait for each alert it must raise (up to its budget + 30 s), then
    take it back (`after`) and wait `settle` seconds; appends an Outcome per expected alert. Returns
    when each fault was injected, to tell its alerts from false alarms (_explained)."""
    injected: list[tuple[float, Fault]] = []
    for fault in faults:
        t0 = time.time()
        fault.inject()
        injected.append((t0, fault))
        for expect in fault.expect:
            limit = budget_of(expect, fault)
            got = hook.wait_for(lambda a, e=expect: a.status == "firing" and e.matches(a.name, a.labels),
                                timeout=max(0.0, t0 + limit + 30 - time.time()), since=t0)
            outcome = Outcome(fault.key, fault.title, str(expect), round(limit, 1),
                              expected_labels={"alertname": expect.alertname, **expect.labels})
            if got is not None:
                outcome.received, outcome.latency = got.labels, round(got.at - t0, 1)
            outcomes.append(outcome)
            log(f"{fault.key}: {expect} -> "
                + (f"received after {outcome.latency}s (budget {outcome.budget}s)" if got else "NOT received"))
        if fault.after:
            fault.after()
            time.sleep(settle)
    return injected


def launcher_processes(name: str):
    from launcher.state import load_cluster

    record = load_cluster(name)
    return record.processes if record else []


def _explained(alert: Received, injected: list[tuple[float, Fault]]) -> bool:
    return any(alert.at >= t0 and expect.matches(alert.name, alert.labels)
               for t0, fault in injected for expect in [*fault.expect, *fault.allow])


def _describe(alert: Received) -> dict:
    return {"alertname": alert.name, "labels": alert.labels, "at": alert.at}


def to_json(report: Report) -> str:
    return json.dumps({**asdict(report), "ok": report.ok}, indent=2)
