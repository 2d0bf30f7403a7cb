"""What one read of the exporters means for one attempt: its faults, each with the evidence a person
needs to believe it. Pure: the watcher feeds it reads and the time, and remembers what it reported.

Which GPU faults take a node out of the next attempt follows NVIDIA's action per XID, from the same
list the alert rules use (alerts/config.py CRITICAL_XIDS): a reset or a reboot (79, 48, 64, 95, ...)
takes the node out; 94 (contained ECC) asks only for the application to restart; 63 (a row remap
recorded) is not a fault. A lost GPU, a failed row remap, a double-bit ECC error or a recovery
action the driver asks for take the node out too.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from alerts.config import CRITICAL_XIDS
from launcher.health.exporters import NodeRead
from launcher.health.policy import FaultClass, HealthPolicy

XID_RESTART_IN_PLACE = frozenset({94})
XID_NOT_A_FAULT = frozenset({63})
XID_NODE_OUT = frozenset(CRITICAL_XIDS) - XID_RESTART_IN_PLACE - XID_NOT_A_FAULT
RECOVERY_ACTIONS = {1: "GPU reset", 2: "node reboot", 3: "drain peer-to-peer", 4: "drain and reset"}
UNCORRECTED = ("uncorrected", "double_bit")  # the ECC error types that are double-bit


@dataclass(frozen=True)
class Fault:
    kind: FaultClass
    summary: str  # what a person reads: "hang (ranks 0-7 made no progress for 905 s; last step 41200)"
    at: float  # when it happened, as far as the evidence says (unix time)
    key: str  # the same fault is reported once
    node: str | None = None  # the node at fault, for faults of a node
    node_out: bool = False  # keep the node out of the next attempt
    last_step: int | None = None  # the newest step any rank reported before it
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Attempt:
    """What the watcher knows of the attempt it watches."""

    number: int
    submission_id: str
    started_at: float  # unix time it was submitted (faults older than this are not its)
    running_at: float | None = None


@dataclass
class Baseline:
    """Counters as the attempt's first read found them (XID and ECC counts live since the exporter
    started; only what grows during the attempt is the attempt's)."""

    ecc: dict[tuple[str, str], float] = field(default_factory=dict)  # (node, uuid) -> uncorrected errors
    alive_nodes: dict[str, str] = field(default_factory=dict)  # Ray node id -> node name, alive at the start
    taken: bool = False

    def take(self, reads: Iterable[NodeRead], retired: Collection[str] = ()) -> None:
        names = {}
        for read in reads:
            if not read.ok:
                continue
            for node_id in read.ray_node_ids:
                names[node_id] = read.target.node
            for key, value in _uncorrected(read).items():
                self.ecc[key] = value
        for read in reads:
            for sample in read.select("raypulse_ray_node_alive"):
                node_id = sample.labels.get("node_id", "")
                if sample.value == 1 and node_id and node_id not in retired:
                    self.alive_nodes[node_id] = names.get(node_id, sample.labels.get("node_ip") or node_id[:12])
        self.taken = True


def _uncorrected(read: NodeRead) -> dict[tuple[str, str], float]:
    totals: dict[tuple[str, str], float] = {}
    for sample in read.select("raypulse_gpu_ecc_errors_total"):
        if sample.labels.get("type") in UNCORRECTED:
            key = (read.target.node, sample.labels.get("uuid", ""))
            totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def ranks_text(ranks: Iterable[int]) -> str:
    """`rank 3`, `ranks 0-7`, `ranks 0-2, 5`."""
    ordered = sorted(set(ranks))
    runs: list[list[int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs]
    return ("ranks " if len(ordered) > 1 else "rank ") + ", ".join(parts)


@dataclass(frozen=True)
class Progress:
    """The attempt's training progress over every node: per rank, the newest report and step."""

    last_report: dict[int, float]
    step: dict[int, int]
    nonfinite_loss: dict[int, float]
    checkpoint_step: int | None
    # Per rank, the first step of the attempt and when the job made it, as the job reported them
    # (exporters older than these families serve neither).
    first_step: dict[int, int] = field(default_factory=dict)
    first_report: dict[int, float] = field(default_factory=dict)

    @property
    def newest_step(self) -> int | None:
        return max(self.step.values(), default=None)

    @property
    def started(self) -> tuple[int, float] | None:
        """The attempt's first step over every rank and when it was made, as the job reported it."""
        made = [(self.first_report[rank], step) for rank, step in self.first_step.items() if rank in self.first_report]
        if not made:
            return None
        return min(step for _, step in made), min(at for at, _ in made)


def _whole(text: str | float | None) -> int | None:
    """A label or a value as a whole number; None for what is not one (an exporter is foreign input:
    a rank "x" or a step NaN is left out, never an exception in the watcher)."""
    try:
        number = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return int(number) if math.isfinite(number) else None


def progress(reads: Iterable[NodeRead], submission_id: str) -> Progress:
    last: dict[int, float] = {}
    steps: dict[int, int] = {}
    iterations: dict[int, int] = {}
    nonfinite: dict[int, float] = {}
    checkpoint: int | None = None
    first_step: dict[int, int] = {}
    first_report: dict[int, float] = {}
    for read in reads:
        # A training step and an RL iteration (a loop that reports only progress.report_iteration) are
        # both progress.
        for name in ("raypulse_train_last_progress_time_seconds", "raypulse_rl_last_iteration_time_seconds"):
            for sample in read.select(name, submission_id=submission_id):
                rank = _whole(sample.labels.get("rank", "0"))
                if rank is not None and math.isfinite(sample.value):
                    last[rank] = max(last.get(rank, 0.0), sample.value)
        for name, into in (("raypulse_train_step", steps), ("raypulse_rl_iteration", iterations)):
            for sample in read.select(name, submission_id=submission_id):
                rank, value = _whole(sample.labels.get("rank", "0")), _whole(sample.value)
                if rank is not None and value is not None:
                    into[rank] = max(into.get(rank, 0), value)
        for sample in read.select("raypulse_train_first_step", submission_id=submission_id):
            rank, value = _whole(sample.labels.get("rank", "0")), _whole(sample.value)
            if rank is not None and value is not None:
                first_step[rank] = min(first_step.get(rank, value), value)
        for sample in read.select("raypulse_train_first_progress_time_seconds", submission_id=submission_id):
            rank = _whole(sample.labels.get("rank", "0"))
            if rank is not None and math.isfinite(sample.value):
                first_report[rank] = min(first_report.get(rank, sample.value), sample.value)
        for sample in read.select("raypulse_train_nonfinite_values_total", submission_id=submission_id, field="loss"):
            rank = _whole(sample.labels.get("rank", "0"))
            if rank is not None and math.isfinite(sample.value):
                nonfinite[rank] = nonfinite.get(rank, 0.0) + sample.value
        for sample in read.select("raypulse_train_checkpoint_step", submission_id=submission_id):
            value = _whole(sample.value)
            if value is not None:
                checkpoint = max(checkpoint or 0, value)
    # A rank that reports RL iterations but no training steps: its iteration is its step.
    return Progress(last, {**iterations, **steps}, nonfinite, checkpoint, first_step, first_report)


def last_output(reads: Iterable[NodeRead], submission_id: str) -> float | None:
    """The newest write to any log of the job's processes (driver and workers), over every node."""
    times = [sample.value for read in reads for name in ("raypulse_job_output_last_write_time_seconds",
                                                        "raypulse_job_driver_log_last_write_time_seconds")
             for sample in read.select(name, submission_id=submission_id)]
    return max(times, default=None)


def job_nodes(reads: Iterable[NodeRead], submission_id: str) -> set[str]:
    """The nodes where the job has processes now (empty while no exporter has mapped them)."""
    return {read.target.node for read in reads
            if any(s.value > 0 for s in read.select("raypulse_job_processes", submission_id=submission_id))}


def find(policy: HealthPolicy, reads: list[NodeRead], attempt: Attempt, baseline: Baseline, now: float,
         dead_nodes: Iterable[str] = ()) -> list[Fault]:
    """Every fault this read shows, most serious first: lost nodes, GPU faults, non-finite losses, a hang."""
    usable = [read for read in reads if read.ok]
    seen = progress(usable, attempt.submission_id)
    faults = [*_lost_nodes(usable, baseline, set(dead_nodes), now, seen.newest_step)]
    nodes = job_nodes(usable, attempt.submission_id)
    for read in usable:
        if not nodes or read.target.node in nodes:
            faults += _gpu_faults(read, attempt, baseline, now, seen.newest_step)
    faults += _nonfinite(seen, attempt, now)
    # A hang is judged only on a whole view: an exporter that does not answer is news, never a hang.
    if len(usable) == len(reads) and reads:
        hang = _hang(policy, usable, seen, attempt, now)
        if hang is not None:
            faults.append(hang)
    return faults


def _lost_nodes(reads: list[NodeRead], baseline: Baseline, dead: set[str], now: float,
                step: int | None) -> list[Fault]:
    faults = []
    for name in sorted(dead):
        faults.append(Fault(FaultClass.NODE_LOST, f"node lost ({name}: its Ray node process exited)", now,
                            f"node_lost:{name}", name, True, step, {"node": name}))
    for read in reads:
        for sample in read.select("raypulse_ray_node_alive"):
            node_id = sample.labels.get("node_id", "")
            name = baseline.alive_nodes.get(node_id)
            if sample.value == 0 and name is not None and name not in dead:
                faults.append(Fault(FaultClass.NODE_LOST, f"node lost ({name}: Ray declared node {node_id[:12]} "
                                    "dead)", now, f"node_lost:{name}", name, True, step,
                                    {"node": name, "node_id": node_id}))
    return faults


def _gpu_faults(read: NodeRead, attempt: Attempt, baseline: Baseline, now: float, step: int | None) -> list[Fault]:
    node = read.target.node
    faults = []

    where = {"node": node, "ray_node_ids": sorted(read.ray_node_ids), "host": _host(read.target.url)}
    if read.target.pod:  # a KubeRay sidecar's: `node` is the pod's Kubernetes node (spec.nodeName)
        where.update(pod=read.target.pod, node_is="the pod's spec.nodeName")

    def fault(what: str, key: str, at: float, node_out: bool = True, **evidence: Any) -> None:
        faults.append(Fault(FaultClass.GPU_FAULT, f"GPU fault ({what} on {node})", at, f"gpu:{node}:{key}", node,
                            node_out, step, {**where, **evidence}))

    for sample in read.select("raypulse_gpu_xid_last_timestamp_seconds"):
        xid, gpu = _whole(sample.labels.get("xid", "0")), sample.labels.get("gpu", "?")
        if xid is not None and sample.value >= attempt.started_at and xid not in XID_NOT_A_FAULT and \
                (xid in XID_NODE_OUT or xid in XID_RESTART_IN_PLACE):
            fault(f"XID {xid} on GPU {gpu}", f"xid{xid}:{gpu}:{sample.value:.0f}", sample.value,
                  node_out=xid in XID_NODE_OUT, xid=xid, gpu=gpu, uuid=sample.labels.get("uuid", ""))
    for sample in read.select("raypulse_gpu_up"):
        if sample.value == 0:
            gpu = sample.labels.get("gpu", "?")
            fault(f"GPU {gpu} lost", f"lost:{sample.labels.get('uuid', gpu)}", now, gpu=gpu)
    for sample in read.select("raypulse_gpu_row_remap_failed"):
        if sample.value == 1:
            fault(f"row remapping failed on GPU {sample.labels.get('gpu', '?')}",
                  f"remap:{sample.labels.get('uuid', '')}", now, gpu=sample.labels.get("gpu", "?"))
    for sample in read.select("raypulse_gpu_recovery_action"):
        action = _whole(sample.value)
        if action in RECOVERY_ACTIONS:
            fault(f"the driver asks for a {RECOVERY_ACTIONS[action]} of GPU {sample.labels.get('gpu', '?')}",
                  f"recovery:{sample.labels.get('uuid', '')}:{action}", now, recovery_action=action)
    for (name, uuid), count in _uncorrected(read).items():
        before = baseline.ecc.get((name, uuid), 0.0)
        if count > before:
            fault(f"{count - before:.0f} double-bit ECC error(s) on GPU {uuid}", f"ecc:{uuid}:{count:.0f}", now,
                  uuid=uuid)
    return faults


def _host(url: str) -> str:
    return urlsplit(url).hostname or ""


def _nonfinite(seen: Progress, attempt: Attempt, now: float) -> list[Fault]:
    bad = sorted(rank for rank, count in seen.nonfinite_loss.items() if count > 0)
    if not bad:
        return []
    steps = [seen.step[rank] for rank in bad if rank in seen.step]
    at_step = f" at step {max(steps)}" if steps else ""
    return [Fault(FaultClass.NONFINITE_LOSS, f"non-finite loss ({ranks_text(bad)} reported NaN or infinity"
                  f"{at_step})", now, f"nonfinite:{attempt.number}", None, False, seen.newest_step,
                  {"ranks": bad})]


def _hang(policy: HealthPolicy, reads: list[NodeRead], seen: Progress, attempt: Attempt, now: float) -> Fault | None:
    reporting = {rank: at for rank, at in seen.last_report.items() if at >= attempt.started_at}
    if reporting:
        newest = max(reporting.values())
        quiet = now - newest
        if quiet <= policy.hang_after_seconds:
            return None
        step = seen.newest_step
        return Fault(FaultClass.HANG, f"hang ({ranks_text(reporting)} made no progress for {quiet:.0f} s; last step "
                     f"{step})", newest, f"hang:{attempt.number}", None, False, step,
                     {"quiet_seconds": round(quiet, 1), "ranks": sorted(reporting), "threshold":
                      policy.hang_after_seconds})
    if attempt.running_at is None:
        return None  # not running yet: the pre-running deadline's business
    output = last_output(reads, attempt.submission_id)
    since = max(output or 0.0, attempt.running_at)
    quiet = now - since
    if quiet <= policy.silence_after_seconds:
        return None
    return Fault(FaultClass.HANG, f"hang (no output from any of the job's processes for {quiet:.0f} s, and no "
                 "progress reported)", since, f"silence:{attempt.number}", None, False, None,
                 {"quiet_seconds": round(quiet, 1), "threshold": policy.silence_after_seconds,
                  "last_output": output})
