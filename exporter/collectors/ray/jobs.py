"""Ray jobs as the Jobs API lists them (`GET /api/jobs/`), and their `raypulse_job_*` families.

Every job series carries `job_id` (Ray's job id, empty until the driver connects) and
`submission_id` (empty for a driver started by hand); who the job is (name, run, workspace,
user, labels) lives on `raypulse_job_info` / `raypulse_job_label_info` to join on. The launcher
puts those in the job metadata under `raypulse.*` (docs/progress.md lists the keys); jobs
submitted with plain `ray job submit` have none and are exported all the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.contract import wire
from exporter.framework.catalog import gauge, info
from exporter.framework.snapshot import SampleSink

NAME = "ray_head"  # the head collector emits these families
STATES = ("PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED")
TERMINAL = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
MAX_VALUE_LENGTH = 128
MAX_USER_LABELS = 16
_LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}$")
_ENUM_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
JOB_LABELS = ("job_id", "submission_id")
_HEAD = "on the head node while the Ray dashboard answers"


def _job_gauge(name: str, help: str, labels: tuple[str, ...] = (), unit: str = "", only_when: str = _HEAD):
    return gauge(f"raypulse_job_{name}", help, collector=NAME, labels=JOB_LABELS + labels, unit=unit,
                 only_when=only_when)


INFO = info("raypulse_job_info", "Who a Ray job is: type (SUBMISSION or DRIVER) and what the launcher put in its "
            "metadata (empty for jobs submitted otherwise).", collector=NAME,
            labels=(*JOB_LABELS, "type", "job_name", "run_id", "workspace", "user"), only_when=_HEAD)
LABEL_INFO = info("raypulse_job_label_info", f"One user label of a job (metadata {wire.META_LABEL_PREFIX}<key>): "
                  f"at most {MAX_USER_LABELS} per job, values cut at {MAX_VALUE_LENGTH} characters.",
                  collector=NAME, labels=(*JOB_LABELS, "label_key", "label_value"), only_when="for jobs with labels")
STATE = _job_gauge("state", "1 for the job's current state, 0 for the others (PENDING, RUNNING, STOPPED, "
                   "SUCCEEDED, FAILED).", ("state",))
ATTEMPT = _job_gauge("attempt", "Attempt number of this submission within its run (1-based; metadata "
                     "raypulse.attempt).", only_when="for jobs the launcher submitted")
MAX_ATTEMPTS = _job_gauge("max_attempts", "Attempts the run may make in all (metadata raypulse.max_attempts).",
                          only_when="for jobs the launcher submitted")
SUBMIT_TIME = _job_gauge("submit_time_seconds", "Unix time the job was submitted.", unit="seconds")
START_TIME = _job_gauge("start_time_seconds", "Unix time the job started running (its driver process started, "
                        "or the exporter first saw it RUNNING).", unit="seconds",
                        only_when="once the job has been seen running")
END_TIME = _job_gauge("end_time_seconds", "Unix time the job reached a terminal state.", unit="seconds",
                      only_when="for finished jobs")
PENDING = _job_gauge("pending_seconds", "Seconds from submission to running; still growing while PENDING.",
                     unit="seconds", only_when="while pending, or once the start time is known")
DURATION = _job_gauge("duration_seconds", "Seconds from submission to the end (or to now while not finished).",
                      unit="seconds")
EXIT_CODE = _job_gauge("driver_exit_code", "Exit code of the job's entrypoint.",
                       only_when="once the entrypoint has exited")
ERROR = info("raypulse_job_error_info", "Why a job failed, as Ray classifies it (error_type, e.g. "
             "JOB_ENTRYPOINT_COMMAND_ERROR for a non-zero exit, RUNTIME_ENV_SETUP_FAILURE).", collector=NAME,
             labels=(*JOB_LABELS, "error_type"), only_when="for jobs Ray gave an error type")
DRIVER_LOG = _job_gauge("driver_log_last_write_time_seconds", "Unix time the driver's log was last written; "
                        "a running job whose log stays silent may be hung.", unit="seconds",
                        only_when="when the driver's log is on the head exporter's host")


def _text(value: object) -> str:
    return "" if value is None else str(value)[:MAX_VALUE_LENGTH]


def _number(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def enum_value(value: object, fallback: str = "OTHER") -> str:
    """A Ray enum name as a label value; anything unexpected becomes `fallback` (never free text)."""
    text = _text(value).upper()
    return text if _ENUM_RE.match(text) else fallback


@dataclass(frozen=True)
class Job:
    job_id: str
    submission_id: str
    type: str
    status: str
    error_type: str
    submit_time: float | None
    end_time: float | None
    driver_exit_code: float | None
    driver_pid: int | None
    driver_node_id: str
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Stable across the job's life: the submission id, or the job id of a driver started by hand."""
        return self.submission_id or self.job_id

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def labels(self) -> dict[str, str]:
        return {"job_id": self.job_id, "submission_id": self.submission_id}

    def meta(self, key: str) -> str:
        """A metadata value by its wire key (wire.META_*), empty when absent."""
        return self.metadata.get(key, "")

    def meta_int(self, key: str) -> int | None:
        value = self.meta(key)
        return int(value) if value.isdigit() else None

    def user_labels(self) -> list[tuple[str, str]]:
        labels = [(k.removeprefix(wire.META_LABEL_PREFIX), v) for k, v in sorted(self.metadata.items())
                  if k.startswith(wire.META_LABEL_PREFIX)]
        return [(k, v) for k, v in labels if _LABEL_KEY_RE.match(k)][:MAX_USER_LABELS]


def parse_job(raw: Mapping[str, object]) -> Job | None:
    """One entry of `GET /api/jobs/`; None for something that is not a job."""
    status = _text(raw.get("status")).upper()
    if status not in STATES:
        return None
    driver = raw.get("driver_info") if isinstance(raw.get("driver_info"), dict) else {}
    metadata = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
    submit, end = _number(raw.get("start_time")), _number(raw.get("end_time"))  # Ray's start_time is submit time
    pid = _number(driver.get("pid"))  # type: ignore[union-attr]
    job = Job(job_id=_text(raw.get("job_id")), submission_id=_text(raw.get("submission_id")),
              type=enum_value(raw.get("type"), "SUBMISSION"), status=status,
              error_type=enum_value(raw.get("error_type"), "") if raw.get("error_type") else "",
              submit_time=submit / 1000 if submit else None, end_time=end / 1000 if end else None,
              driver_exit_code=_number(raw.get("driver_exit_code")), driver_pid=int(pid) if pid else None,
              driver_node_id=_text(raw.get("driver_node_id")),
              metadata={str(k): _text(v) for k, v in metadata.items()})  # type: ignore[union-attr]
    return job if job.key else None


def select_jobs(jobs: Iterable[Job], now: float, retention_seconds: float, max_finished: int) -> list[Job]:
    """What to export: every job not yet finished, and the most recent finished ones within the window."""
    active, finished = [], []
    for job in jobs:
        if not job.terminal:
            active.append(job)
        elif job.end_time is not None and now - job.end_time <= retention_seconds:
            finished.append(job)
    finished.sort(key=lambda j: j.end_time or 0, reverse=True)
    return active + finished[:max_finished]


class StartTimes:
    """When each job started running. Ray's Jobs API keeps only the submit and end times, so the
    start is the driver process's start when the driver runs on this host, else the first run in
    which the exporter saw the job RUNNING (as precise as the collection interval)."""

    def __init__(self) -> None:
        self._started: dict[str, float] = {}
        self._seen_pending: set[str] = set()

    def update(self, jobs: Iterable[Job], now: float, driver_start: Callable[[Job], float | None]) -> None:
        current = set()
        for job in jobs:
            current.add(job.key)
            if job.key in self._started:
                continue
            if job.status == "PENDING":
                self._seen_pending.add(job.key)
            elif job.status == "RUNNING":
                started = driver_start(job) or (now if job.key in self._seen_pending else None)
                if started is not None:
                    self._started[job.key] = started
        for gone in set(self._started) - current:
            del self._started[gone]
        self._seen_pending &= current

    def get(self, job: Job) -> float | None:
        return self._started.get(job.key)


def emit(out: SampleSink, jobs: Iterable[Job], starts: StartTimes, session_dirs: Iterable[Path], now: float) -> None:
    session_dirs = list(session_dirs)
    for job in jobs:
        labels = job.labels
        out.add_info(INFO, **labels, type=job.type, job_name=job.meta(wire.META_JOB_NAME),
                     run_id=job.meta(wire.META_RUN_ID), workspace=job.meta(wire.META_WORKSPACE),
                     user=job.meta(wire.META_USER))
        for key, value in job.user_labels():
            out.add_info(LABEL_INFO, **labels, label_key=key, label_value=value)
        for state in STATES:
            out.add(STATE, state == job.status, **labels, state=state)
        out.add(ATTEMPT, job.meta_int(wire.META_ATTEMPT), **labels)
        out.add(MAX_ATTEMPTS, job.meta_int(wire.META_MAX_ATTEMPTS), **labels)
        out.add(SUBMIT_TIME, job.submit_time, **labels)
        out.add(END_TIME, job.end_time, **labels)
        started = starts.get(job)
        out.add(START_TIME, started, **labels)
        if job.submit_time is not None:
            if job.status == "PENDING":
                out.add(PENDING, max(0.0, now - job.submit_time), **labels)
            elif started is not None:
                out.add(PENDING, max(0.0, started - job.submit_time), **labels)
            out.add(DURATION, max(0.0, (job.end_time or now) - job.submit_time), **labels)
        out.add(EXIT_CODE, job.driver_exit_code, **labels)
        if job.error_type:
            out.add_info(ERROR, **labels, error_type=job.error_type)
        if job.submission_id:
            out.add(DRIVER_LOG, driver_log_mtime(session_dirs, job.submission_id), **labels)


def driver_log_mtime(session_dirs: Iterable[Path], submission_id: str) -> float | None:
    """The driver log's mtime (`<session>/logs/job-driver-<submission_id>.log`) if it is on this host."""
    if "/" in submission_id or submission_id.startswith("."):
        return None
    for session in session_dirs:
        try:
            return (session / "logs" / f"job-driver-{submission_id}.log").stat().st_mtime
        except OSError:
            continue
    return None
