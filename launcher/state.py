"""What the launcher remembers between commands, under $RAYPULSE_HOME (default ~/.raypulse):

    runs/<run_id>/run.json          the run: where it ran, its state and every attempt
    runs/<run_id>/attempt-<n>.log   each attempt's driver log, kept after the cluster is gone
    runs/<run_id>/stop              `launcher stop` asks the submitting process to stop (no retries)
    clusters/<name>/cluster.json    a running local cluster: address, processes, exporters
    clusters/<name>/token           its Ray auth token (mode 0600)
    audit.log                       JSON lines, one per action (launcher/audit.py)

Records are written whole and atomically (temp file + rename), so a reader never sees half of one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from exporter import wire


def home() -> Path:
    return Path(os.environ.get(wire.ENV_HOME) or "~/.raypulse").expanduser()


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(temp, path)


class ProcessRef(BaseModel):
    """A process we started; create_time guards against a reused pid."""

    pid: int
    create_time: float
    role: str  # "head", "worker", "exporter"
    node: str  # "head", "workers-1", ...


class ExporterRef(BaseModel):
    node: str
    role: str
    url: str  # http://127.0.0.1:<port> (/metrics, /healthz, /sd on the head)
    progress_url: str | None = None  # what RAYPULSE_PROGRESS_URL is set to on that node
    gpu_control: str | None = None  # simulated GPUs: the file `exporter gpu-fault --control` writes faults to


class ClusterRecord(BaseModel):
    name: str
    address: str  # dashboard URL (Jobs API)
    gcs_address: str
    token_path: str
    temp_dir: str
    tag: str  # value of wire.ENV_CLUSTER_TAG in every process of the cluster (teardown finds them by it)
    kept: bool  # started by `up` or --keep-cluster: stays until `launcher down`
    started_at: float = Field(default_factory=time.time)
    processes: list[ProcessRef] = Field(default_factory=list)
    exporters: list[ExporterRef] = Field(default_factory=list)

    @property
    def directory(self) -> Path:
        return cluster_dir(self.name)

    def save(self) -> None:
        _write_atomic(self.directory / "cluster.json", self.model_dump_json(indent=2))


def cluster_dir(name: str) -> Path:
    return home() / "clusters" / name


def load_cluster(name: str) -> ClusterRecord | None:
    try:
        return ClusterRecord.model_validate_json((cluster_dir(name) / "cluster.json").read_text())
    except FileNotFoundError:
        return None


def list_clusters() -> list[ClusterRecord]:
    root = home() / "clusters"
    records = [load_cluster(path.name) for path in sorted(root.iterdir())] if root.is_dir() else []
    return [record for record in records if record is not None]


def write_token(name: str, token: str) -> Path:
    path = cluster_dir(name) / "token"
    _write_atomic(path, token, mode=0o600)
    return path


class AttemptRecord(BaseModel):
    attempt: int
    submission_id: str
    status: str = "PENDING"  # Ray's JobStatus, or NOT_SUBMITTED
    message: str | None = None
    error_type: str | None = None
    driver_exit_code: int | None = None
    submitted_at: float | None = None
    running_at: float | None = None
    ended_at: float | None = None
    # Training progress as the health watcher saw it (jobs that report through exporter.progress).
    resumed_from_step: int | None = None  # the checkpoint step it was given to resume from
    first_step: int | None = None
    first_step_at: float | None = None
    last_step: int | None = None
    last_progress_at: float | None = None


class EventRecord(BaseModel):
    """One event of the run's journal (launcher/journal.py): what changed, when, and the line shown."""

    time: float
    kind: str  # e.g. attempt.submitted, retry.scheduled, run.finished
    attempt: int | None = None
    message: str | None = None  # the line the launcher showed for it, if any
    details: dict[str, Any] = Field(default_factory=dict)


class RunRecord(BaseModel):
    """One logical job across its attempts."""

    run_id: str
    name: str
    backend: str
    address: str | None = None  # where its attempts were submitted
    cluster: str | None = None  # the local cluster it ran on
    cluster_kept: bool = False
    checkpoint_dir: str | None = None  # RAYPULSE_CHECKPOINT_DIR of every attempt
    denied_hosts: list[str] = Field(default_factory=list)  # hosts kept out for good (existing clusters)
    max_attempts: int = 1
    pid: int | None = None  # the launcher process that supervises the run
    state: str = "STARTING"  # STARTING, PENDING, RUNNING, RETRYING, or a final state (exitcodes.FINAL_STATES)
    reason: str | None = None
    exit_code: int | None = None
    trace_id: str | None = None  # the OTLP trace of its latest submit (launcher/tracing.py), when traced
    created_at: float = Field(default_factory=time.time)
    finished_at: float | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    events: list[EventRecord] = Field(default_factory=list)  # the run's journal, oldest first
    spec: dict[str, Any] = Field(default_factory=dict)

    @property
    def directory(self) -> Path:
        return run_dir(self.run_id)

    def save(self) -> None:
        _write_atomic(self.directory / "run.json", self.model_dump_json(indent=2))

    def attempt_log(self, attempt: int) -> Path:
        return self.directory / f"attempt-{attempt}.log"

    def attempt(self, number: int) -> AttemptRecord | None:
        return next((item for item in self.attempts if item.attempt == number), None)


def run_dir(run_id: str) -> Path:
    return home() / "runs" / run_id


def load_run(run_id: str) -> RunRecord | None:
    try:
        return RunRecord.model_validate_json((run_dir(run_id) / "run.json").read_text())
    except FileNotFoundError:
        return None


def list_runs() -> list[RunRecord]:
    root = home() / "runs"
    records = [load_run(path.name) for path in root.iterdir()] if root.is_dir() else []
    return sorted((record for record in records if record is not None), key=lambda record: -record.created_at)


def request_stop(run_id: str) -> None:
    _write_atomic(run_dir(run_id) / "stop", f"{time.time()}\n")


def clear_stop(run_id: str) -> None:
    (run_dir(run_id) / "stop").unlink(missing_ok=True)


def stop_requested(run_id: str) -> bool:
    return (run_dir(run_id) / "stop").exists()
