"""The drill's fault catalog: every fault, how it is injected, and which alerts must arrive.

GPU faults go to the simulated GPUs of the cluster's GPU worker (one GPU each, never the one the
job's rank 0 holds, except the load collapse that targets it) through the simulator's control
file; whole-NVML faults (a hung call, a driver that does not load) go to a spare exporter; job
faults go to the drill job's control file; node faults kill real processes.

Not faults, so not drilled: the simulator's `not-supported` (a capability: the series is omitted),
`mig` and `process` (configuration; `process` is used to tie the job to its GPU).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from exporter.gpusim import control

# Seconds the source needs before the metric shows the fault, on top of scrape, evaluation and
# `for` (the drill runs the GPU, train and Ray collectors every 1-2 s).
COLLECT = 2.0


@dataclass(frozen=True)
class Expect:
    alertname: str
    labels: dict[str, str] = field(default_factory=dict)

    def matches(self, alertname: str, labels: dict[str, str]) -> bool:
        return alertname == self.alertname and all(labels.get(k) == v for k, v in self.labels.items())

    def __str__(self) -> str:
        return self.alertname + ("{" + ", ".join(f"{k}={v}" for k, v in self.labels.items()) + "}"
                                 if self.labels else "")


@dataclass
class Fault:
    key: str
    title: str  # what was done, for the table
    inject: Callable[[], None]
    expect: list[Expect]
    allow: list[Expect] = field(default_factory=list)  # side effects that are true, not false alarms
    source_delay: float = COLLECT
    after: Callable[[], None] | None = None  # undo what must not outlive the fault


@dataclass
class Context:
    cluster: str
    gpu_node: str  # the worker with simulated GPUs
    cpu_node: str  # the worker without GPUs (its exporter, then the node itself, are killed)
    spare_node: str  # a standalone exporter with simulated GPUs for whole-NVML faults
    gpu_control: Path
    spare_control: Path
    job_control: Path
    submission_id: str
    job_gpu: int  # NVML index of the GPU the job's rank 0 holds
    free_gpus: list[int]
    cluster_processes: list[Any]  # the launcher's ProcessRefs
    restart_spare: Callable[[], None]
    stall_age: float = 30.0  # RaypulseTrainingStalled's `age` at the drill's scale: no progress for this long
    node_death_delay: float = 10.0  # Ray's health checks to declare a killed node dead


def _gpu(ctx: Context, index: int, change: Callable[[control.GpuControl], None]) -> Callable[[], None]:
    return lambda: control.update(ctx.gpu_control, lambda c: change(control.gpu_entry(c, index)))


def _job(ctx: Context, **flags: bool) -> Callable[[], None]:
    def write() -> None:
        current = json.loads(ctx.job_control.read_text()) if ctx.job_control.exists() else {}
        temp = ctx.job_control.with_suffix(".tmp")
        temp.write_text(json.dumps({**current, **flags}))
        os.replace(temp, ctx.job_control)  # the ranks never read half a file
    return write


def _kill(ctx: Context, role: str, node: str, raylet: bool = False) -> Callable[[], None]:
    def kill() -> None:
        ref = next(p for p in ctx.cluster_processes if p.role == role and p.node == node)
        process = psutil.Process(ref.pid)
        if raylet:  # SIGKILL the node's raylet: Ray sees an unexpected death, as when a host dies
            process = next(child for child in process.children(recursive=True)
                           if "raylet" in " ".join(child.cmdline()))
        process.send_signal(signal.SIGKILL)
    return kill


def catalog(ctx: Context) -> list[Fault]:
    gpus = iter(ctx.free_gpus)
    at_gpu = {"cluster": ctx.cluster, "node": ctx.gpu_node}
    spare = {"cluster": ctx.cluster, "node": ctx.spare_node}
    job = {"cluster": ctx.cluster, "submission_id": ctx.submission_id}

    def gpu_fault(key: str, title: str, change: Callable[[control.GpuControl], None], expect: list[str | Expect],
                  allow: tuple[str, ...] = (), delay: float = COLLECT) -> Fault:
        index = next(gpus)
        where = {**at_gpu, "gpu": str(index)}
        # A lost GPU may also drop out of the node's GPU count: that alert is true too.
        return Fault(key, title.format(gpu=index), _gpu(ctx, index, change),
                     [e if isinstance(e, Expect) else Expect(e, where) for e in expect],
                     [Expect(name, where) for name in allow] + [Expect("RaypulseGpuCountLow", at_gpu)], delay)

    def set_(name: str, value: Any) -> Callable[[control.GpuControl], None]:
        return lambda entry: setattr(entry, name, value)

    def xid(code: int) -> Callable[[control.GpuControl], None]:
        return lambda entry: control.inject_xid(entry, code)

    faults = [
        gpu_fault("xid-79", "XID 79 (fallen off the bus) on GPU {gpu}", xid(79),
                  ["RaypulseGpuXidCritical", "RaypulseGpuLost"]),
        gpu_fault("xid-48", "XID 48 (double-bit ECC) on GPU {gpu}", xid(48),
                  ["RaypulseGpuXidCritical", "RaypulseGpuDoubleBitEccErrors"]),
        gpu_fault("xid-94", "XID 94 (contained ECC error: remap pending, reset asked) on GPU {gpu}", xid(94),
                  ["RaypulseGpuXidCritical", "RaypulseGpuDoubleBitEccErrors", "RaypulseGpuRowRemapPending",
                   "RaypulseGpuRecoveryActionRequired"]),
        gpu_fault("xid-13", "XID 13 (graphics engine exception, an application XID) on GPU {gpu}", xid(13),
                  ["RaypulseGpuXidError"]),
        gpu_fault("ecc-dbe", "2 double-bit ECC errors on GPU {gpu}", set_("ecc_dbe", 2),
                  ["RaypulseGpuDoubleBitEccErrors"]),
        gpu_fault("ecc-sbe", "5000 single-bit ECC errors on GPU {gpu}", set_("ecc_sbe", 5000),
                  ["RaypulseGpuCorrectedEccErrorsHigh"]),
        gpu_fault("row-remap-pending", "row remap pending on GPU {gpu}", set_("row_remap_pending", True),
                  ["RaypulseGpuRowRemapPending"]),
        gpu_fault("row-remap-failed", "row remap failed on GPU {gpu}", set_("row_remap_failed", True),
                  ["RaypulseGpuRowRemapFailed"]),
        gpu_fault("recovery-action", "driver asks for a node reboot (recovery action 2) on GPU {gpu}",
                  set_("recovery_action", 2), ["RaypulseGpuRecoveryActionRequired"]),
        gpu_fault("thermal-throttle", "thermal throttling on GPU {gpu}", set_("thermal_throttle", True),
                  ["RaypulseGpuThermalSlowdown"], delay=COLLECT + 2),
        gpu_fault("power-brake", "hardware power brake on GPU {gpu}", set_("power_brake", True),
                  ["RaypulseGpuPowerBrakeSlowdown"], delay=COLLECT + 2),
        gpu_fault("nvlink-down", "NVLink link 3 down on GPU {gpu}", set_("nvlink_down", [3]),
                  ["RaypulseGpuNvlinkDown"], allow=("RaypulseGpuNvlinkErrors",)),
        gpu_fault("gpu-lost", "GPU {gpu} lost without an XID", set_("lost", True), ["RaypulseGpuLost"]),
        gpu_fault("nvml-error", "nvmlDeviceGetPowerUsage fails with UNKNOWN on GPU {gpu}",
                  lambda entry: entry.errors.update({"nvmlDeviceGetPowerUsage": "UNKNOWN"}),
                  [Expect("RaypulseGpuNvmlCallFailing", {**at_gpu, "call": "nvmlDeviceGetPowerUsage"})]),
        Fault("gpu-load-collapse", f"the job's GPU {ctx.job_gpu} drops to 2% load (load 0.02)",
              _gpu(ctx, ctx.job_gpu, set_("load", 0.02)), [Expect("RaypulseJobGpuUtilizationCollapsed", job)],
              source_delay=COLLECT + 3, after=_gpu(ctx, ctx.job_gpu, set_("load", None))),
        Fault("nvml-hang", "every NVML power reading hangs on the spare exporter's GPUs",
              lambda: control.update(ctx.spare_control, lambda c: c.hang.append("nvmlDeviceGetPowerUsage")),
              [Expect("RaypulseExporterCollectorStuck", {**spare, "collector": "gpu"})], source_delay=COLLECT + 5,
              after=lambda: control.update(ctx.spare_control, lambda c: c.hang.clear())),
        Fault("nvml-init-error", "the spare exporter restarts with the driver not loaded (init-error)",
              lambda: (control.update(ctx.spare_control, lambda c: setattr(c, "init_error", "DRIVER_NOT_LOADED")),
                       ctx.restart_spare()),
              [Expect("RaypulseGpuNvmlDown", spare)], allow=[Expect("RaypulseExporterDown", spare)],
              source_delay=COLLECT + 4),
        Fault("nan-loss", "rank 0 reports a NaN loss", _job(ctx, nan=True),
              [Expect("RaypulseTrainingLossNonFinite", {**job, "rank": "0"})], after=_job(ctx, nan=False)),
        Fault("job-stalled", "every rank stops making progress (a hang)", _job(ctx, stall=True),
              [Expect("RaypulseTrainingStalled", job)],
              allow=[Expect("RaypulseJobDriverLogSilent", job), Expect("RaypulseTrainingThroughputDropped", job)],
              source_delay=ctx.stall_age + COLLECT, after=_job(ctx, stall=False)),
        Fault("job-failed", "the ranks raise: the job fails (no retries)", _job(ctx, fail=True),
              [Expect("RaypulseJobFailed", job)], source_delay=COLLECT + 3),
        Fault("exporter-killed", f"the exporter of {ctx.cpu_node} is killed (SIGKILL)",
              _kill(ctx, "exporter", ctx.cpu_node),
              [Expect("RaypulseExporterDown", {"cluster": ctx.cluster, "node": ctx.cpu_node})], source_delay=0),
        Fault("node-killed", f"worker node {ctx.cpu_node} is killed (its raylet, SIGKILL)",
              _kill(ctx, "worker", ctx.cpu_node, raylet=True),
              [Expect("RaypulseRayNodeLost", {"cluster": ctx.cluster, "node": ctx.cpu_node})],
              source_delay=ctx.node_death_delay),
    ]
    return faults


QUICK = ("xid-79", "nan-loss", "job-failed", "exporter-killed", "node-killed")

