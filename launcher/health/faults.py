"""What one read of the exporters means for one attempt: its faults, each with the evidence a person
needs to believe it. Pure: the watcher feeds it reads and the time, and remembers what it reported.

Which GPU faults take a node out of the next attempt follows NVIDIA's action per XID, from the same
list the alert rules use (alerts/config.py CRITICAL_XIDS): a reset or a reboot (79, 48, 64, 95, ...)
takes the node out; 94 (contained ECC) asks only for the application to restart; 63 (a row remap
recorded) is not a fault. A lost GPU, a failed row remap, a double-bit ECC error or a recovery
action the driver asks for take the node out too.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from alerts.config import CRITICAL_XIDS
from exporter.contract.digest import JobDigest
from launcher.health.exporters import NodeRead
from launcher.health.policy import FaultClass, HealthPolicy
from launcher.health.threshold import HangLearner, Threshold, running_phases

XID_RESTART_IN_PLACE = frozenset({94})
XID_NOT_A_FAULT = frozenset({63})
XID_NODE_OUT = frozenset(CRITICAL_XIDS) - XID_RESTART_IN_PLACE - XID_NOT_A_FAULT
RECOVERY_ACTIONS = {1: "GPU reset", 2: "node reboot", 3: "drain peer-to-peer", 4: "drain and reset"}


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
    """Counters as the attempt's first read of each node found them (XID and ECC counts live since the
    exporter started; only what grows during the attempt is the attempt's), and the Ray nodes alive
    when the head's view was first read."""

    ecc: dict[tuple[str, str], float] = field(default_factory=dict)  # (node, uuid) -> uncorrected errors
    alive_nodes: dict[str, str] = field(default_factory=dict)  # Ray node id -> node name, alive at the start
    nodes: set[str] = field(default_factory=set)  # the nodes whose counters are taken
    taken: bool = False  # the Ray nodes alive are taken

    def take(self, reads: Iterable[NodeRead], retired: Collection[str] = ()) -> None:
        """What the reads show of nodes not taken yet (a node unread at the attempt's start is taken at
        its first read: its counters then are not the attempt's)."""
        usable = [read for read in reads if read.digest is not None]
        for read in usable:
            if read.target.node not in self.nodes:
                self.nodes.add(read.target.node)
                for uuid, value in read.digest.ecc_uncorrected.items():
                    self.ecc[(read.target.node, uuid)] = value
        if self.taken:
            return
        views = [read.digest.ray_nodes for read in usable if read.digest.ray_nodes]
        if not views:
            return
        names = {node_id: read.target.node for read in usable for node_id in read.digest.ray_node_ids}
        for view in views:
            for node_id, (alive, ip) in view.items():
                if alive and node_id not in retired:
                    self.alive_nodes[node_id] = names.get(node_id, ip or node_id[:12])
        self.taken = True


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
    # The slowest rank's last checkpoint save (seconds), the newest save's time and the most saves a rank
    # made (None from exporters that serve no checkpoint timing).
    checkpoint_seconds: float | None = None
    checkpoint_at: float | None = None
    checkpoints: float | None = None

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


def progress(reads: Iterable[NodeRead], submission_id: str) -> Progress:
    """The attempt's progress over the nodes read (as each node's digest reduced its ranks)."""
    last: dict[int, float] = {}
    steps: dict[int, int] = {}
    nonfinite: dict[int, float] = {}
    checkpoint: int | None = None
    first_step: dict[int, int] = {}
    first_report: dict[int, float] = {}
    saves: dict[str, float] = {}
    for job in jobs(reads, submission_id):
        for rank, (step, at, first, first_at) in job.ranks.items():
            if at is not None:
                last[rank] = max(last.get(rank, at), at)
            if step is not None:
                steps[rank] = max(steps.get(rank, step), step)
            if first is not None:
                first_step[rank] = min(first_step.get(rank, first), first)
            if first_at is not None:
                first_report[rank] = min(first_report.get(rank, first_at), first_at)
        for rank, count in job.nonfinite.items():
            nonfinite[rank] = nonfinite.get(rank, 0.0) + count
        if job.checkpoint_step is not None:
            checkpoint = max(checkpoint or 0, job.checkpoint_step)
        for name in ("checkpoint_seconds", "checkpoint_at", "checkpoints"):
            value = getattr(job, name)
            if value is not None:
                saves[name] = max(saves.get(name, value), value)
    return Progress(last, steps, nonfinite, checkpoint, first_step, first_report, **saves)


def jobs(reads: Iterable[NodeRead], submission_id: str) -> Iterator[JobDigest]:
    """The submission's digests on the nodes read."""
    for read in reads:
        job = read.digest.jobs.get(submission_id) if read.digest is not None else None
        if job is not None:
            yield job


def last_output(reads: Iterable[NodeRead], submission_id: str) -> float | None:
    """The newest write to any log of the job's processes (driver and workers), over every node."""
    return max((job.output_at for job in jobs(reads, submission_id) if job.output_at is not None), default=None)


def job_nodes(reads: Iterable[NodeRead], submission_id: str) -> set[str]:
    """The nodes where the job has processes now (empty while no exporter has mapped them)."""
    return {read.target.node for read in reads
            if read.digest is not None and (job := read.digest.jobs.get(submission_id)) is not None and job.processes}


def find(policy: HealthPolicy, reads: list[NodeRead], attempt: Attempt, baseline: Baseline, now: float,
         dead_nodes: Iterable[str] = (), seen: Progress | None = None,
         threshold: Threshold | None = None) -> list[Fault]:
    """Every fault this read shows, most serious first: lost nodes, GPU faults, non-finite losses, a hang.
    A node that was not read is judged by none of them: the hang is judged on the nodes that answered
    (the watcher reports the others as unreachable), and only when some did. `threshold`: the hang
    threshold in force (hang_threshold()); without one, the policy's own for what this read shows."""
    usable = [read for read in reads if read.digest is not None]
    seen = seen if seen is not None else progress(usable, attempt.submission_id)
    faults = [*_lost_nodes(usable, baseline, set(dead_nodes), now, seen.newest_step)]
    nodes = job_nodes(usable, attempt.submission_id)
    for read in usable:
        if not nodes or read.target.node in nodes:
            faults += _gpu_faults(read, attempt, baseline, now, seen.newest_step)
    faults += _nonfinite(seen, attempt, now)
    if threshold is None:
        threshold = hang_threshold(policy, HangLearner(), usable, attempt)
    hang = _hang(policy, usable, seen, attempt, now, len(usable) == len(reads), threshold) if usable else None
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
        for node_id, (alive, _) in read.digest.ray_nodes.items():
            name = baseline.alive_nodes.get(node_id)
            if not alive and name is not None and name not in dead:
                faults.append(Fault(FaultClass.NODE_LOST, f"node lost ({name}: Ray declared node {node_id[:12]} "
                                    "dead)", now, f"node_lost:{name}", name, True, step,
                                    {"node": name, "node_id": node_id}))
    return faults


def _gpu_faults(read: NodeRead, attempt: Attempt, baseline: Baseline, now: float, step: int | None) -> list[Fault]:
    node = read.target.node
    seen = read.digest
    faults: list[Fault] = []
    if not (seen.xids or seen.gpus_lost or seen.remap_failed or seen.recovery or seen.ecc_uncorrected):
        return faults  # nearly every node of a large run, nearly every check

    where = {"node": node, "ray_node_ids": list(seen.ray_node_ids), "host": _host(read.target.url)}
    if read.target.pod:  # a KubeRay sidecar's: `node` is the pod's Kubernetes node (spec.nodeName)
        where.update(pod=read.target.pod, node_is="the pod's spec.nodeName")

    def fault(what: str, key: str, at: float, node_out: bool = True, **evidence: Any) -> None:
        faults.append(Fault(FaultClass.GPU_FAULT, f"GPU fault ({what} on {node})", at, f"gpu:{node}:{key}", node,
                            node_out, step, {**where, **evidence}))

    for xid, gpu, uuid, at in seen.xids:
        if at >= attempt.started_at and xid not in XID_NOT_A_FAULT and (xid in XID_NODE_OUT or
                                                                          xid in XID_RESTART_IN_PLACE):
            fault(f"XID {xid} on GPU {gpu}", f"xid{xid}:{gpu}:{at:.0f}", at, node_out=xid in XID_NODE_OUT, xid=xid,
                  gpu=gpu, uuid=uuid)
    for gpu, uuid in seen.gpus_lost:
        fault(f"GPU {gpu} lost", f"lost:{uuid or gpu}", now, gpu=gpu)
    for gpu, uuid in seen.remap_failed:
        fault(f"row remapping failed on GPU {gpu}", f"remap:{uuid}", now, gpu=gpu)
    for gpu, uuid, action in seen.recovery:
        if action in RECOVERY_ACTIONS:
            fault(f"the driver asks for a {RECOVERY_ACTIONS[action]} of GPU {gpu}", f"recovery:{uuid}:{action}", now,
                  recovery_action=action)
    for uuid, count in seen.ecc_uncorrected.items():
        before = baseline.ecc.get((node, uuid), 0.0)
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


def hang_threshold(policy: HealthPolicy, learner: HangLearner, reads: list[NodeRead], attempt: Attempt) -> Threshold:
    """The hang threshold in force for what these reads show (the phases running) and what the run taught."""
    return learner.in_force(policy, running_phases(jobs(reads, attempt.submission_id), attempt.started_at))


def _hang(policy: HealthPolicy, reads: list[NodeRead], seen: Progress, attempt: Attempt, now: float,
          whole: bool, threshold: Threshold) -> Fault | None:
    """No rank of the nodes read advanced (nor began an RL phase) for the threshold in force; when no
    rank reports progress, no output for the silence threshold, judged only on a whole view (the
    silent logs may be the unread nodes')."""
    reporting = {rank: at for rank, at in seen.last_report.items() if at >= attempt.started_at}
    running = running_phases(jobs(reads, attempt.submission_id), attempt.started_at)
    if reporting or running:
        newest = max([*reporting.values(), *running.values()])
        quiet = now - newest
        if quiet <= threshold.seconds:
            return None
        step = seen.newest_step
        who = f"phase {threshold.phase} ran" if threshold.phase else f"{ranks_text(reporting)} made no progress"
        return Fault(FaultClass.HANG, f"hang ({who} for {quiet:.0f} s; last step {step})", newest,
                     f"hang:{attempt.number}", None, False, step,
                     {"quiet_seconds": round(quiet, 1), "ranks": sorted(reporting), **threshold.evidence()})
    if attempt.running_at is None or not whole:
        return None  # not running yet (the pre-running deadline's business), or not every node was read
    output = last_output(reads, attempt.submission_id)
    since = max(output or 0.0, attempt.running_at)
    quiet = now - since
    if quiet <= policy.silence_after_seconds:
        return None
    return Fault(FaultClass.HANG, f"hang (no output from any of the job's processes for {quiet:.0f} s, and no "
                 "progress reported)", since, f"silence:{attempt.number}", None, False, None,
                 {"quiet_seconds": round(quiet, 1), "threshold": policy.silence_after_seconds,
                  "last_output": output})
