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

from pydantic import BaseModel, ConfigDict, Field

VERSION = 1
# A worker's digest is under a kilobyte; the head's lists every Ray node it knows (~50 bytes each).
MAX_DIGEST_BYTES = 1 * 2**20

# The families a digest is made of (and all the launcher reads of /metrics when it reads directly).
PROGRESS_TIME = ("raypulse_train_last_progress_time_seconds", "raypulse_rl_last_iteration_time_seconds")
PHASE_START, PHASE_SECONDS = "raypulse_rl_phase_start_time_seconds", "raypulse_rl_phase_iteration_seconds"
PHASE_FAMILIES = (PHASE_START, PHASE_SECONDS)
CHECKPOINT_SECONDS, CHECKPOINT_TIME, CHECKPOINTS = ("raypulse_train_checkpoint_duration_seconds",
                                              "raypulse_train_last_checkpoint_time_seconds",
                                              "raypulse_train_checkpoints_total")
OUTPUT_TIME = ("raypulse_job_output_last_write_time_seconds", "raypulse_job_driver_log_last_write_time_seconds")
FAMILIES = (
    "raypulse_train_step", *PROGRESS_TIME, "raypulse_train_nonfinite_values_total",
    "raypulse_train_first_step", "raypulse_train_first_progress_time_seconds", "raypulse_rl_iteration",
    "raypulse_train_reports_total", *PHASE_FAMILIES,
    "raypulse_train_checkpoint_step", CHECKPOINT_SECONDS, CHECKPOINT_TIME, CHECKPOINTS, *OUTPUT_TIME,
    "raypulse_job_processes",
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
# Bounds a parse checks (mutable defaults are factories and lists are tuples: a parse of 10,000 digests
# copies no default and calls no Python validator).
MAX_RANKS = 4096
MAX_ITEMS = 1024
MAX_RAY_NODES = 100_000
MAX_PHASES = 64  # a rank reports at most wire.RL_MAX_PHASES (16); the ranks of a node, a few more names


class _Digest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobDigest(_Digest):
    """One Ray job's (a submission's) signals on this node."""

    processes: bool = False  # the job has processes here now
    output_at: Finite | None = None  # the newest write to a log of its processes here (unix time)
    # rank -> (its newest step (its RL iteration when it reports no steps), when it last reported progress,
    # its first step of the attempt, when it made it); one tuple a rank: 8 ranks a node, 10,000 nodes a read
    ranks: dict[Rank, tuple[Step | None, Finite | None, Step | None, Finite | None]] = Field(
        default_factory=dict, max_length=MAX_RANKS)
    # rank -> non-finite losses reported (ranks with none left out)
    nonfinite: dict[Rank, Finite] = Field(default_factory=dict, max_length=MAX_RANKS)
    checkpoint_step: Step | None = None
    # Added after v1's first release, with defaults: a digest without them parses as before.
    # The most progress reports one rank of the job sent here (the watcher's step intervals are measured
    # per report: a job that reports every 100th step is quiet 100 steps between reports).
    reports: Finite | None = None
    # RL phase name -> (since when it runs on some rank here, the oldest start; the longest of the ranks'
    # seconds in it during their last completed iteration): the hang threshold of a phase is its own.
    phases: dict[Text, tuple[Finite | None, Finite | None]] = Field(default_factory=dict, max_length=MAX_PHASES)
    # Checkpoints (for the checkpoint advice, launcher/checkpoint_advice.py): the longest of the ranks' last
    # saves (the job waits for its slowest rank), the newest save's time, and the most saves one rank made.
    checkpoint_seconds: Finite | None = None
    checkpoint_at: Finite | None = None
    checkpoints: Finite | None = None


class NodeDigest(_Digest):
    """What one node's exporter sees that the watcher judges."""

    v: Literal[1]  # no default: always on the wire, however much else is left out as empty
    ray_node_ids: tuple[Text, ...] = Field((), max_length=MAX_ITEMS)  # the Ray nodes this exporter watches
    # the head's: every Ray node id -> (alive, its IP)
    ray_nodes: dict[Text, tuple[bool, Text]] = Field(default_factory=dict, max_length=MAX_RAY_NODES)
    # (xid, gpu, uuid, when it last happened)
    xids: tuple[tuple[int, Text, Text, Finite], ...] = Field((), max_length=MAX_ITEMS)
    gpus_lost: tuple[tuple[Text, Text], ...] = Field((), max_length=MAX_ITEMS)  # (gpu, uuid) NVML cannot reach
    remap_failed: tuple[tuple[Text, Text], ...] = Field((), max_length=MAX_ITEMS)  # (gpu, uuid), remapping failed
    recovery: tuple[tuple[Text, Text, int], ...] = Field((), max_length=MAX_ITEMS)  # (gpu, uuid, action) asked for
    # uuid -> double-bit ECC errors since the exporter started (>0)
    ecc_uncorrected: dict[Text, Finite] = Field(default_factory=dict, max_length=MAX_ITEMS)
    jobs: dict[Text, JobDigest] = Field(default_factory=dict, max_length=MAX_ITEMS)  # by submission id


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
    return NodeDigest(v=VERSION, ray_node_ids=tuple(sorted(ids)), ray_nodes=ray_nodes, xids=tuple(sorted(xids)),
                      gpus_lost=tuple(sorted(lost)), remap_failed=tuple(sorted(remap)),
                      recovery=tuple(sorted(recovery)),
                      ecc_uncorrected={uuid: count for uuid, count in ecc.items() if count > 0},
                      jobs={submission: job.digest() for submission, job in sorted(jobs.items())})


def encode(made: NodeDigest) -> bytes:
    """A digest as it goes on the wire: compact, what is empty left out (a parse gives it back)."""
    return made.model_dump_json(exclude_defaults=True).encode()


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
        self.reports: float | None = None
        self.checkpoint_seconds: float | None = None
        self.checkpoint_at: float | None = None
        self.checkpoints: float | None = None
        self.phase_since: dict[str, float] = {}
        self.phase_seconds: dict[str, float] = {}

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
        if name in (CHECKPOINT_SECONDS, CHECKPOINT_TIME, CHECKPOINTS):
            if math.isfinite(value) and value >= 0:  # each the most over the ranks
                attribute = {CHECKPOINT_SECONDS: "checkpoint_seconds", CHECKPOINT_TIME: "checkpoint_at",
                             CHECKPOINTS: "checkpoints"}[name]
                setattr(self, attribute, max(getattr(self, attribute) or 0.0, value))
            return
        if name in PHASE_FAMILIES:
            phase = labels.get("phase")
            names = self.phase_since.keys() | self.phase_seconds.keys()
            if phase and math.isfinite(value) and value >= 0 and (phase in names or len(names) < MAX_PHASES):
                if name == PHASE_START:
                    self.phase_since[phase] = min(self.phase_since.get(phase, value), value)
                else:
                    self.phase_seconds[phase] = max(self.phase_seconds.get(phase, value), value)
            return
        if name == "raypulse_train_reports_total":
            if math.isfinite(value):
                self.reports = max(self.reports or 0.0, value)
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
        steps = {**self.iterations, **self.steps}
        ranks = sorted({*steps, *self.reported, *self.first_step, *self.first_at})
        return JobDigest(processes=self.processes, output_at=self.output_at,
                         ranks={rank: (steps.get(rank), self.reported.get(rank), self.first_step.get(rank),
                                       self.first_at.get(rank)) for rank in ranks},
                         nonfinite={rank: count for rank, count in self.nonfinite.items() if count > 0},
                         checkpoint_step=self.checkpoint_step, reports=self.reports,
                         checkpoint_seconds=self.checkpoint_seconds, checkpoint_at=self.checkpoint_at,
                         checkpoints=self.checkpoints,
                         phases={phase: (self.phase_since.get(phase), self.phase_seconds.get(phase))
                                 for phase in sorted({*self.phase_since, *self.phase_seconds})})


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
    nodes: tuple[FleetEntry, ...] = ()
