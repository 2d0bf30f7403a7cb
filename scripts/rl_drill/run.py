"""Run the RL drill: the RLlib example's PPO (scripts/rl_drill/job.py) through the launcher on a real
local Ray cluster (a head, one worker with 2 simulated GPUs tied to its EnvRunner and Learner), a real
Prometheus and Alertmanager with the `rl` rules at the drill's scale, a real webhook receiver. A
healthy run that must raise nothing, the RL dashboard's queries run against it (every panel must
return data), then each fault of scripts/rl_drill/faults.py in turn.

Must be run under `flock /tmp/raypulse-ray.lock` (it starts Ray). `python -m scripts.rl_drill --help`.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from alerts.build import rule_files
from alerts.config import DEFAULT, Config
from alerts.prometheus import DEFAULT_SUFFIX, WATCHDOG
from exporter.contract import vllm, wire
from scripts import stack
from scripts.drill import run as drill
from scripts.drill.faults import Expect, Fault
from scripts.drill.run import _describe, _explained, _relabel, _wait, inject_each
from scripts.rl_drill.faults import QUICK, Context, catalog
from scripts.webhook import Webhook

JOB = Path(__file__).resolve().parent / "job.py"
SCALE = 1 / 120  # every duration of alerts/config.py: for: 10m -> 5s, a phase stalled for 30m -> 15s
MIN_WINDOW = 5  # seconds: range windows keep 5 samples at a 1 s scrape
SCRAPE_SECONDS = 1
SLACK_SECONDS = 8.0
RULE_FILES = (f"rl{DEFAULT_SUFFIX}", f"{WATCHDOG}{DEFAULT_SUFFIX}")  # the RL alerts and the Watchdog
RL_BOARD = "raypulse-rl"
COLLECTOR_INTERVALS = {"gpu": 1, "train": 1, "ray": 2, "ray_head": 2, "ray_processes": 2}
SIMULATED_GPUS = 2  # GPU 0: the EnvRunner (generator), GPU 1: the Learner (trainer)


def drill_config() -> Config:
    """The RL rules at SCALE, with the Watchdog loaded (no kube-prometheus-stack here)."""
    return replace(DEFAULT, watchdog=True).scaled(SCALE, MIN_WINDOW)


@dataclass
class Report(drill.Report):
    panels: int = 0  # queries of the RL board run against the healthy run
    empty_panels: list[str] = field(default_factory=list)  # those that returned nothing
    series: dict[str, int] = field(default_factory=dict)  # raypulse_rl_* family -> series, during the healthy run

    @property
    def ok(self) -> bool:
        return super().ok and self.panels > 0 and not self.empty_panels


def budget(expect: Expect, fault: Fault) -> float:
    """scrape + evaluation interval + the alert's scaled `for` + the source's own delay + slack."""
    return 2 * SCRAPE_SECONDS + drill_config().tune(expect.alertname).for_.seconds + fault.source_delay \
        + SLACK_SECONDS


def _exporter_env(gpu_control: Path) -> dict[str, str]:
    env = {wire.ENV_GPU_CONTROL_FILE: str(gpu_control)}
    for name, seconds in COLLECTOR_INTERVALS.items():
        env[f"{wire.ENV_EXPORTER_PREFIX}COLLECTORS__{name.upper()}__INTERVAL_SECONDS"] = str(seconds)
    return env


def run(quick: bool = False, healthy_seconds: float = 90.0, workdir: Path | None = None, log=print) -> Report:
    import launcher
    from dashboards import livecheck
    from exporter.gpusim import control
    from launcher.health.policy import FaultClass
    from launcher.run import submission_id
    from scripts.ports import free_port_range

    started = time.monotonic()
    workdir = workdir or Path(tempfile.mkdtemp(prefix="raypulse-rl-drill-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = Report(quick=quick, scale=SCALE, healthy_seconds=healthy_seconds,
                    started=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    gpu_control, job_control = workdir / "gpu.json", workdir / "job.json"
    # Inherited by the launcher's nodes and exporters; put back as they were once the drill ends (it runs
    # inside the test process, whose later clusters must not share its GPU control file).
    environment = {wire.ENV_HOME: str(workdir / "launcher-home"), **_exporter_env(gpu_control)}
    saved = {key: os.environ.get(key) for key in environment}
    os.environ.update(environment)
    rules = workdir / "rules"
    rules.mkdir(parents=True, exist_ok=True)
    for name, text in rule_files(drill_config()).items():
        if name in RULE_FILES:
            (rules / name).write_text(text)
    base = free_port_range(4)
    spec = {"name": "rl-drill", "simulate_gpus": True, "entrypoint": f"python {JOB} --control {job_control}",
            "exporter_port": base, "progress_port": base + 1,
            # The launcher's health watcher would stop the hung attempt: here it only reports.
            "health": {f"on_{fault.value}": "report" for fault in FaultClass},
            "worker_groups": [{"name": "rl", "count": 1, "cpus": 2, "gpus": SIMULATED_GPUS}]}
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(_restore, saved)
        log("rl drill: starting a cluster (head, a worker with 2 simulated GPUs) and the RLlib job")
        handle = launcher.submit({**spec, "keep_cluster": True, "max_retries": 0})
        name = handle.run_id
        cleanup.callback(launcher.down, name)
        supervisor = threading.Thread(target=handle.wait, name="run-supervisor", daemon=True)
        supervisor.start()

        def job_file(suffix: str) -> dict:
            if not supervisor.is_alive():  # the run ended: nothing more will come
                raise RuntimeError(f"rl drill: the job ended early: {handle.logs()[-3000:]}")
            return json.loads(job_control.with_suffix(suffix).read_text())

        record = handle.cluster
        sid = submission_id(handle.run_id, 1)
        cleanup.callback(lambda: job_control.write_text(json.dumps({"stop": True})))
        hook = cleanup.enter_context(Webhook())
        alerting = cleanup.enter_context(stack.start(
            workdir / "stack", sd_url=record.exporters[0].url + wire.SD_PATH, webhook_url=hook.url,
            rules_dir=rules, scrape_interval=f"{SCRAPE_SECONDS}s", evaluation_interval=f"{SCRAPE_SECONDS}s",
            fast=True, grouping=drill.GROUPING, relabel_configs=_relabel(record.exporters)))
        watch_from = time.time()
        actors = _wait("the job's actors", lambda: job_file(".actors.json"), 240)
        # Tie the actors to the worker's GPUs: NVML lists each process on its GPU, as CUDA's would be.
        for gpu, (role, sm) in enumerate((("generator", 0.35), ("trainer", 0.9))):
            pid = int(actors[role][0])
            control.update(gpu_control, lambda c, gpu=gpu, pid=pid, sm=sm: control.gpu_entry(c, gpu).processes.append(
                control.Process(pid=pid, memory_bytes=(8 + 8 * gpu) << 30, sm_utilization=sm, name="python")))
        _wait("RL iterations in Prometheus",
              lambda: alerting.query(f'raypulse_rl_iterations_total{{submission_id="{sid}"}} > 2'), 180)
        log(f"rl drill: job {sid} trains (actors {actors}); healthy run for {healthy_seconds:g}s")
        time.sleep(healthy_seconds)
        report.healthy_alerts = [_describe(a) for a in hook.snapshot()
                                 if a.status == "firing" and a.name != "RaypulseWatchdog"]
        assert any(a.name == "RaypulseWatchdog" for a in hook.snapshot()), "the Watchdog never arrived"
        report.series = {r["metric"]["__name__"]: int(float(r["value"][1])) for r in alerting.query(
            f'count by (__name__) ({{__name__=~"raypulse_rl_.+", submission_id="{sid}"}})')}
        queried = [r for r in livecheck.run(alerting.prometheus_url, {"cluster": name, "submission": sid},
                                            window=healthy_seconds, step=2, rate_interval="6s")
                   if r.dashboard == RL_BOARD]
        # RLlib runs no vLLM engine: the rollout-engine row's queries are empty only while Prometheus has
        # never seen vLLM's families (tests/test_dashboards_live.py checks them with data).
        board = [r for r in queried if r.series or r.error or not r.absent or not set(r.absent) <= set(vllm.FAMILIES)]
        report.panels = len(board)
        report.empty_panels = [f"{r.panel} / {r.ref_id}: {r.error or r.expr}" for r in board if r.error or not r.series]
        log(f"rl drill: RL board: {len(board) - len(report.empty_panels)} of {len(board)} queries return data "
            f"({len(queried) - len(board)} read only vLLM's engines, which RLlib has none of)")

        config = drill_config()
        ctx = Context(cluster=name, submission_id=sid, job_control=job_control,
                      stall_age=config.tune("RaypulseRLPhaseStalled").age.seconds,
                      sync_delay=config.tune("RaypulseRLWeightSyncSlow").duration.seconds + 3,
                      collapse_window=config.tune("RaypulseRLRewardCollapsed").window.seconds)
        faults = [fault for fault in catalog(ctx) if not quick or fault.key in QUICK]
        # After each fault, the job takes it back (the control file) before the next one.
        injected = inject_each(faults, hook, budget, report.outcomes, lambda text: log(f"rl drill: {text}"),
                               settle=COLLECTOR_INTERVALS["train"])
        report.false_alarms = [_describe(a) for a in hook.snapshot()
                               if a.status == "firing" and a.name != "RaypulseWatchdog" and a.at >= watch_from
                               and not _explained(a, injected)]
    report.wall_seconds = round(time.monotonic() - started, 1)
    return report


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def to_json(report: Report) -> str:
    return json.dumps({**asdict(report), "ok": report.ok}, indent=2)
