"""The healing drill: real local Ray clusters started by the launcher (a head and two workers with
one simulated GPU each), the drill's training job (two ranks that checkpoint), and one fault at a
time, each on a run of its own; the launcher's health watcher must find it and the run must heal.
A healthy run of the same length first, which must not restart at all.

Thresholds are scaled down (a hang after 8 s without progress, silence after 10 s, a check every
second) by the health policy's own fields, the way a user would tune them; everything else is the
product as it ships. Must run under `flock /tmp/raypulse-ray.lock` (it starts Ray).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

import launcher
from exporter.contract import wire
from exporter.gpusim import control as gpus
from launcher.state import RunRecord
from scripts.ports import free_port_range

JOB = Path(__file__).with_name("job.py")
HANG_AFTER_S = 8.0
SILENCE_AFTER_S = 10.0
CHECK_S = 1.0
INJECT_AT_STEP = 22  # two checkpoints in (every 10 steps): a recovery may lose at most one interval
STEPS = 60
STEP_S = 0.25
RECOVERY_SLACK_S = 60.0  # the target: fault to first new step within the detection threshold + this
EXPORTER_FAST = {"ray": "1", "ray_head": "1", "ray_processes": "1", "train": "0.5", "gpu": "1", "gpu_events": "1"}
RAY_HEALTH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
              "RAY_health_check_failure_threshold": "5", "RAY_health_check_initial_delay_ms": "1000"}


@dataclass
class Scenario:
    name: str
    fault: str  # the fault class the watcher must name ("" for the healthy run)
    what: str  # how it is injected, for the report
    threshold: float  # the detection threshold that applies
    inject: Callable[[Context], None] | None = None
    quiet: bool = False  # the job prints but reports no progress
    quick: bool = False


@dataclass
class Context:
    workdir: Path
    record: RunRecord
    cluster: Any  # the run's ClusterRecord

    def state(self) -> dict[str, Any]:
        try:
            return json.loads((self.workdir / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def control(self, key: str, **entry: Any) -> None:
        path = self.workdir / "control.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data[key] = entry
        path.write_text(json.dumps(data))


@dataclass
class Outcome:
    scenario: str
    fault: str
    injected: str
    threshold: float
    exit_code: int | None = None
    state: str = ""
    detected: float | None = None  # seconds from the injection to the health.fault event
    named: str | None = None  # the fault's summary
    recovered: float | None = None  # seconds from the injection to the new attempt's first step
    steps_lost: int | None = None
    checkpoint_interval: int = 10
    node_action: str | None = None
    stacks: str | None = None
    restarts: int = 0
    attempts: int = 0
    effective: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        if self.error:
            return False
        if not self.fault:
            return self.exit_code == 0 and self.restarts == 0
        return (self.exit_code == 0 and self.detected is not None and self.recovered is not None
                and self.recovered <= self.threshold + RECOVERY_SLACK_S
                and (self.steps_lost is None or self.steps_lost <= self.checkpoint_interval))


def _stop_ranks(ranks: str) -> Callable[[Context], None]:
    def inject(context: Context) -> None:
        pids = context.state()["pids"]
        for pid in (pids if ranks == "all" else pids[1:2]):
            os.kill(pid, signal.SIGSTOP)
    return inject


def inject_xid(cluster: Any, node: str, xid: int = 79) -> None:
    """An XID event on GPU 0 of `node` of a local cluster with simulated GPUs (through its control file)."""
    ref = next(ref for ref in cluster.exporters if ref.node == node)
    gpus.update(Path(ref.gpu_control), lambda document: gpus.append_event(gpus.gpu_entry(document, 0), "xid", xid))


def kill_node(cluster: Any, node: str) -> None:
    """SIGKILL a worker node whole: its `ray start --block` session (raylet, workers, agents)."""
    ref = next(ref for ref in cluster.processes if ref.node == node and ref.role == "worker")
    os.killpg(ref.pid, signal.SIGKILL)


SCENARIOS = [
    Scenario("healthy", "", "nothing (the same job, run to its end)", 0.0, quick=True),
    Scenario("all-ranks-hung", "hang", "SIGSTOP to every rank", HANG_AFTER_S, _stop_ranks("all"), quick=True),
    Scenario("one-rank-hung", "hang", "SIGSTOP to rank 1 (rank 0 then blocks in the step's collective)",
             HANG_AFTER_S, _stop_ranks("one")),
    Scenario("xid-79", "gpu_fault", "XID 79 (fallen off the bus) on workers-1's GPU", CHECK_S,
             lambda context: inject_xid(context.cluster, "workers-1"), quick=True),
    Scenario("node-killed", "node_lost", "SIGKILL to workers-2 (its whole Ray node)", CHECK_S,
             lambda context: kill_node(context.cluster, "workers-2")),
    Scenario("nan-loss", "nonfinite_loss", "rank 0 reports a NaN loss", CHECK_S,
             lambda context: context.control("nan", attempt=1, step=INJECT_AT_STEP)),
    Scenario("silent-job", "hang", "a job that prints but reports no progress goes quiet", SILENCE_AFTER_S,
             lambda context: context.control("silent", attempt=1, step=INJECT_AT_STEP), quiet=True),
]


def _environment(workdir: Path) -> dict[str, str]:
    env = {f"{wire.ENV_EXPORTER_PREFIX}COLLECTORS__{name.upper()}__INTERVAL_SECONDS": seconds
           for name, seconds in EXPORTER_FAST.items()}
    return {**env, **RAY_HEALTH, wire.ENV_HOME: str(workdir / "home")}


def _spec(scenario: Scenario, workdir: Path) -> dict[str, Any]:
    base = free_port_range(6)
    command = f"python {JOB.name} --state {workdir}/state.json --control {workdir}/control.json --steps {STEPS} " \
              f"--step-seconds {STEP_S}" + (" --quiet" if scenario.quiet else "")
    return {"name": f"heal-{scenario.name}"[:38], "entrypoint": command, "working_dir": str(JOB.parent),
            "worker_groups": [{"count": 2, "cpus": 1, "gpus": 1}], "simulate_gpus": True,
            "max_retries": 2, "retry_backoff_seconds": 1, "exporter_port": base, "progress_port": base + 1,
            "health": {"check_interval_seconds": CHECK_S, "hang_after_seconds": HANG_AFTER_S,
                       "silence_after_seconds": SILENCE_AFTER_S}}


def run_scenario(scenario: Scenario, workdir: Path, log: Callable[[str], None]) -> Outcome:
    workdir.mkdir(parents=True, exist_ok=True)
    outcome = Outcome(scenario.name, scenario.fault, scenario.what, scenario.threshold)
    handle = launcher.submit(_spec(scenario, workdir))
    finished: list[RunRecord] = []
    waiter = threading.Thread(target=lambda: finished.append(handle.wait()), daemon=True)
    waiter.start()
    injected_at = None
    try:
        context = Context(workdir, handle.record, handle.cluster)
        deadline = time.monotonic() + 240
        while context.state().get("step", 0) < INJECT_AT_STEP - 2 and not finished:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the job did not reach step {INJECT_AT_STEP} within 240 s")
            time.sleep(0.1)
        if scenario.inject is not None and not finished:
            if scenario.name in ("nan-loss", "silent-job"):
                injected_at = _when_step(context, INJECT_AT_STEP, scenario.inject)
            else:
                while context.state().get("step", 0) < INJECT_AT_STEP:
                    time.sleep(0.05)
                scenario.inject(context)
                injected_at = time.time()
            log(f"{scenario.name}: injected {scenario.what}")
        waiter.join(600)
        if not finished:
            raise TimeoutError("the run did not end within 10 minutes")
    except Exception as exc:  # noqa: BLE001 - one scenario's trouble is its row in the report
        outcome.error = f"{type(exc).__name__}: {exc}"
        handle.stop()
        waiter.join(120)
    finally:
        _continue_stopped(workdir)
    record = finished[0] if finished else handle.record
    _measure(outcome, record, injected_at)
    return outcome


def _when_step(context: Context, step: int, inject: Callable[[Context], None]) -> float:
    """Faults the job injects into itself at a step (through the control file): written ahead, timed
    from the moment the job reaches that step."""
    inject(context)
    while context.state().get("step", 0) < step - 1:
        time.sleep(0.02)
    return time.time()


def _continue_stopped(workdir: Path) -> None:
    """SIGCONT whatever the drill stopped, should the run have left it behind."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        for pid in json.loads((workdir / "state.json").read_text())["pids"]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)


def _measure(outcome: Outcome, record: RunRecord, injected_at: float | None) -> None:
    outcome.exit_code, outcome.state, outcome.attempts = record.exit_code, record.state, len(record.attempts)
    acted = [event for event in record.events
             if event.kind == "health.fault" and event.details.get("action") != "report"]
    outcome.restarts = sum(1 for event in record.events if event.kind == "retry.scheduled")
    if acted and injected_at is not None:
        outcome.detected = round(acted[0].time - injected_at, 1)
        outcome.named = acted[0].details.get("summary")
    recovered = next((event for event in record.events if event.kind == "health.recovered"), None)
    if recovered is not None:
        outcome.steps_lost = recovered.details.get("steps_lost")
    second = record.attempt(2)
    if second is not None and injected_at is not None:
        first = second.first_step_at or (second.running_at if outcome.fault and not recovered else None)
        if first is not None:
            outcome.recovered = round(first - injected_at, 1)
    node = next((event for event in record.events if event.kind.startswith("node.")), None)
    outcome.node_action = node.message if node is not None else None
    stacks = next((event for event in record.events if event.kind == "health.stacks"), None)
    outcome.stacks = stacks.details.get("summary") if stacks is not None else None
    outcome.effective = _effective(record)


def _effective(record: RunRecord) -> float | None:
    return next((event.details.get("effective_training_ratio") for event in reversed(record.events)
                 if event.kind == "run.finished"), None)


@dataclass
class Report:
    quick: bool
    outcomes: list[Outcome] = field(default_factory=list)
    wall_seconds: float = 0.0
    started: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.outcomes) and all(outcome.ok for outcome in self.outcomes)


def run(quick: bool = False, only: list[str] | None = None, log: Callable[[str], None] = print) -> Report:
    report = Report(quick, started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    started = time.monotonic()
    chosen = [s for s in SCENARIOS if (not quick or s.quick) and (not only or s.name in only)]
    with tempfile.TemporaryDirectory(prefix="heal-drill-") as temp:
        saved = {key: os.environ.get(key) for key in _environment(Path(temp))}
        os.environ.update(_environment(Path(temp)))
        try:
            for scenario in chosen:
                log(f"{scenario.name}: starting")
                outcome = run_scenario(scenario, Path(temp) / scenario.name, log)
                log(f"{scenario.name}: {'ok' if outcome.ok else 'FAILED'} {asdict(outcome)}")
                report.outcomes.append(outcome)
                _left_behind(log)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    report.wall_seconds = round(time.monotonic() - started, 1)
    return report


def _left_behind(log: Callable[[str], None]) -> None:
    """A scenario leaves no process of its cluster behind (the next one starts clean)."""
    left = [p for p in psutil.process_iter(["name"]) if p.info["name"] in ("raylet", "gcs_server")]
    if left:
        log(f"warning: {len(left)} Ray process(es) left behind: {[p.pid for p in left]}")


def to_json(report: Report) -> str:
    return json.dumps({"quick": report.quick, "ok": report.ok, "wall_seconds": report.wall_seconds,
                       "outcomes": [asdict(outcome) | {"ok": outcome.ok} for outcome in report.outcomes]}, indent=2)
