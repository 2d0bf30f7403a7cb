"""A node's health digest: the signals the launcher's watcher judges a node by, reduced where they are
collected. Every exporter serves its own (wire.DIGEST_PATH), the head's gathers every node's into one
fleet document (wire.FLEET_PATH, exporter/serving/fleet.py), and the launcher reads that one document
per check instead of every node's exposition (launcher/health/fleet.py).

One reduction for both ends: `build()` turns the watched families' samples into a digest, on the
exporter from its own snapshots and in the launcher from a node's /metrics when it reads an exporter
directly (one too old to serve a digest). The launcher judges faults from digests only, so a fault is
the same fault whichever way the node was read.

A digest is foreign input where it is read (a node may be hostile): `NodeDigest` is the strict parse,
and every number in it is finite and every rank a whole number, or the digest is refused whole.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

VERSION = 1
# A worker's digest is under a kilobyte; the head's lists every Ray node it knows (~50 bytes each).
MAX_DIGEST_BYTES = 1 * 2**20

# The families a digest is made of (and all the launcher reads of /metrics when it reads directly).
PROGRESS_TIME = ("raypulse_train_last_progress_time_seconds", "raypulse_rl_last_iteration_time_seconds")
OUTPUT_TIME = ("raypulse_job_output_last_write_time_seconds", "raypulse_job_driver_log_last_write_time_seconds")
FAMILIES = (
    "raypulse_train_step", *PROGRESS_TIME, "raypulse_train_nonfinite_values_total",
    "raypulse_train_first_step", "raypulse_train_first_progress_time_seconds", "raypulse_rl_iteration",
    "raypulse_train_checkpoint_step", *OUTPUT_TIME, "raypulse_job_processes",
    "raypulse_gpu_xid_last_timestamp_seconds", "raypulse_gpu_up", "raypulse_gpu_ecc_errors_total",
    "raypulse_gpu_row_remap_failed", "raypulse_gpu_recovery_action", "raypulse_ray_node_alive",
    "raypulse_ray_node_info",
)
UNCORRECTED = ("uncorrected", "double_bit")  # the ECC error types that are double-bit
# How a read's error begins when nothing listens at the node's exporter yet (the head's reads and the
# launcher's say it alike), and the head's word for a node it has not read yet: a node that never
# answered and says either is starting, not unreachable (for a grace: launcher/health/watcher.py).
REFUSED = "ConnectionRefusedError"
NOT_READ_YET = "not read yet"

Finite = Annotated[float, Field(allow_inf_nan=False)]
Rank = Annotated[int, Field(ge=0, lt=2**31)]
Step = Annotated[int, Field(ge=-(2**62), lt=2**62)]
Text = Annotated[str, Field(max_length=256)]


class _Digest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobDigest(_Digest):
    """One Ray job's (a submission's) signals on this node."""

    processes: bool = False  # the job has processes here now
    output_at: Finite | None = None  # the newest write to a log of its processes here (unix time)
    reported: dict[Rank, Finite] = {}  # rank -> when it last reported progress (a step or an RL iteration)
    steps: dict[Rank, Step] = {}  # rank -> its newest step (its RL iteration when it reports no steps)
    first_step: dict[Rank, Step] = {}  # rank -> its first step of the attempt
    first_at: dict[Rank, Finite] = {}  # rank -> when it made it
    nonfinite: dict[Rank, Finite] = {}  # rank -> non-finite losses reported (ranks with none left out)
    checkpoint_step: Step | None = None


class NodeDigest(_Digest):
    """What one node's exporter sees that the watcher judges."""

    v: Literal[1] = VERSION
    ray_node_ids: list[Text] = []  # the Ray nodes this exporter watches
    ray_nodes: dict[Text, tuple[bool, Text]] = {}  # the head's: every Ray node id -> (alive, its IP)
    xids: list[tuple[int, Text, Text, Finite]] = []  # (xid, gpu, uuid, when it last happened)
    gpus_lost: list[tuple[Text, Text]] = []  # (gpu, uuid) that NVML cannot reach
    remap_failed: list[tuple[Text, Text]] = []  # (gpu, uuid) whose row remapping failed
    recovery: list[tuple[Text, Text, int]] = []  # (gpu, uuid, action) the driver asks for
    ecc_uncorrected: dict[Text, Finite] = {}  # uuid -> double-bit ECC errors since the exporter started (>0)
    jobs: dict[Text, JobDigest] = {}  # by submission id

    @model_validator(mode="after")
    def _bounded(self) -> NodeDigest:
        if len(self.jobs) > 1024 or len(self.xids) > 4096:
            raise ValueError("more jobs or XIDs than a node has")
        return self


def whole(value: str | float | None) -> int | None:
    """A label or a value as a whole number; None for what is not one (a rank "x" or a step NaN is
    left out, never an exception)."""
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and abs(number) < 2**62 else None


def build(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> NodeDigest:
    """The digest of a node's watched samples (name, labels, value); samples of other families are
    ignored, and so is what is not a number where a number is meant."""
    ids: set[str] = set()
    ray_nodes: dict[str, tuple[bool, str]] = {}
    xids: list[tuple[int, str, str, float]] = []
    lost: list[tuple[str, str]] = []
    remap: list[tuple[str, str]] = []
    recovery: list[tuple[str, str, int]] = []
    ecc: dict[str, float] = {}
    jobs: dict[str, _Job] = {}
    for name, labels, value in samples:
        if name.startswith(("raypulse_train_", "raypulse_rl_", "raypulse_job_")):
            submission = labels.get("submission_id")
            if submission:
                job = jobs.get(submission)
                if job is None:
                    job = jobs[submission] = _Job()
                job.add(name, labels, value)
            continue
        gpu, uuid = labels.get("gpu", "?"), labels.get("uuid", "")
        if name == "raypulse_ray_node_info":
            if labels.get("node_id"):
                ids.add(labels["node_id"])
        elif name == "raypulse_ray_node_alive":
            if labels.get("node_id"):
                ray_nodes[labels["node_id"]] = (value == 1, labels.get("node_ip", ""))
        elif name == "raypulse_gpu_xid_last_timestamp_seconds":
            xid = whole(labels.get("xid"))
            if xid is not None and math.isfinite(value):
                xids.append((xid, gpu, uuid, value))
        elif name == "raypulse_gpu_up" and value == 0:
            lost.append((gpu, uuid))
        elif name == "raypulse_gpu_row_remap_failed" and value == 1:
            remap.append((gpu, uuid))
        elif name == "raypulse_gpu_recovery_action":
            action = whole(value)
            if action:
                recovery.append((gpu, uuid, action))
        elif name == "raypulse_gpu_ecc_errors_total" and labels.get("type") in UNCORRECTED and math.isfinite(value):
            ecc[uuid] = ecc.get(uuid, 0.0) + value
    return NodeDigest(ray_node_ids=sorted(ids), ray_nodes=ray_nodes, xids=sorted(xids), gpus_lost=sorted(lost),
                      remap_failed=sorted(remap), recovery=sorted(recovery),
                      ecc_uncorrected={uuid: count for uuid, count in ecc.items() if count > 0},
                      jobs={submission: job.digest() for submission, job in sorted(jobs.items())})


class _Job:
    """A job's signals as they are gathered from its samples."""

    def __init__(self) -> None:
        self.processes = False
        self.output_at: float | None = None
        self.reported: dict[int, float] = {}
        self.steps: dict[int, int] = {}
        self.iterations: dict[int, int] = {}
        self.first_step: dict[int, int] = {}
        self.first_at: dict[int, float] = {}
        self.nonfinite: dict[int, float] = {}
        self.checkpoint_step: int | None = None

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        if name == "raypulse_job_processes":
            self.processes = self.processes or value > 0
            return
        if name in OUTPUT_TIME:
            if math.isfinite(value):
                self.output_at = max(self.output_at or value, value)
            return
        if name == "raypulse_train_checkpoint_step":
            step = whole(value)
            if step is not None:
                self.checkpoint_step = max(self.checkpoint_step or 0, step)
            return
        rank = whole(labels.get("rank", "0"))
        if rank is None or not 0 <= rank < 2**31:
            return
        if name in PROGRESS_TIME:
            if math.isfinite(value):
                self.reported[rank] = max(self.reported.get(rank, 0.0), value)
        elif name in ("raypulse_train_step", "raypulse_rl_iteration"):
            step = whole(value)
            into = self.steps if name == "raypulse_train_step" else self.iterations
            if step is not None:
                into[rank] = max(into.get(rank, step), step)
        elif name == "raypulse_train_first_step":
            step = whole(value)
            if step is not None:
                self.first_step[rank] = min(self.first_step.get(rank, step), step)
        elif name == "raypulse_train_first_progress_time_seconds":
            if math.isfinite(value):
                self.first_at[rank] = min(self.first_at.get(rank, value), value)
        elif name == "raypulse_train_nonfinite_values_total" and labels.get("field") == "loss" and \
                math.isfinite(value):
            self.nonfinite[rank] = self.nonfinite.get(rank, 0.0) + value

    def digest(self) -> JobDigest:
        # A rank that reports RL iterations but no training steps: its iteration is its step.
        return JobDigest(processes=self.processes, output_at=self.output_at, reported=self.reported,
                         steps={**self.iterations, **self.steps}, first_step=self.first_step,
                         first_at=self.first_at,
                         nonfinite={rank: count for rank, count in self.nonfinite.items() if count > 0},
                         checkpoint_step=self.checkpoint_step)


class FleetEntry(_Digest):
    """One node as the head last read it: its digest, or why there is none."""

    node: Text  # the node's name, as /sd labels it
    target: Text  # its exporter, host:port as /sd lists it
    digest: NodeDigest | None = None
    error: Text | None = None  # why the head has no digest of it now
    answered: bool = False  # it has answered the head at least once (one that never did may be starting)


class FleetDocument(_Digest):
    """The head's answer at wire.FLEET_PATH: every node it lists (`full`), or those whose entry changed
    since the cursor asked for (the generation names the head's process: another one's cursor means
    nothing, so it is answered in full)."""

    v: Literal[1] = VERSION
    generation: Text
    cursor: int
    full: bool
    listed: int  # the nodes the head lists now
    read_at: Finite | None = None  # when the head's last round of reads ended (unix time)
    nodes: list[FleetEntry] = []
