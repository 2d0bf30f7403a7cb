"""What a run needs from where it lives: the Backend protocol that local clusters, existing clusters
and KubeRay implement, the Placement a followed run gets from its backend, and the Jobs its attempts
are (how the attempt engine, launcher/run.py, submits, reads, streams and stops them there).

A backend is resolved once per command (launcher/backends/__init__.py `resolve`) and bound to the
spec it was resolved for. The rest of the launcher asks it (what it refuses, where checkpoints go,
how a cluster is started or attached, which exporters to read, how a faulty node is taken out, how
a recorded run's cluster is reached again) instead of comparing backend names.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from launcher.errors import BadInput
from launcher.state import ClusterRecord, ExporterAccess, RunRecord, claim_supervision, clear_stop, release_supervision

if TYPE_CHECKING:  # annotations only: every command imports this protocol, not all of what a run reads
    from launcher.display import Reporter
    from launcher.health.exporters import Target
    from launcher.health.remedy import NodeRemedy
    from launcher.jobs import JobsClient
    from launcher.journal import Journal
    from launcher.raydash import RayDashboard
    from launcher.spec import JobSpec


class Exporters(Protocol):
    """Where a run's exporters are and how to read them: what the health watcher and the recorder share."""

    @property
    def access(self) -> ExporterAccess | None:
        """TLS trust and credentials for exporters under a web config (None: plain HTTP)."""
        ...

    @property
    def progress_url(self) -> str | None:
        """The head exporter's progress endpoint, where the run's own health metrics are published."""
        ...

    def targets(self) -> list[Target]:
        """Every node's exporter now (nodes come and go: asked at every check)."""
        ...

    def sd_url(self) -> str | None:
        """The head exporter's service discovery URL (None: not known yet)."""
        ...

    def head_url(self) -> str | None:
        """The head exporter whose fleet document (every node's health digest) the watcher reads; None: it
        reads each exporter itself."""
        ...


@dataclass
class Seen:
    """One attempt as its backend sees it now (Ray's JobDetails, a RayJob's status), in one shape."""

    submission_id: str | None  # None: the platform has not named (started) the attempt yet
    status: str  # Ray's job status: PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED
    message: str | None = None
    error_type: str | None = None
    driver_exit_code: int | None = None
    start_time: float | None = None  # seconds since the epoch
    end_time: float | None = None
    job: dict[str, Any] | None = None  # what stacks need of it (launcher/run.py job_view); None: not known
    retried: bool = False  # it failed and the platform retries it itself (retry.scheduled, no submit)
    preempted: bool = False  # the platform's queue took it back (Kueue): not a failure, its next attempt follows
    run_end: tuple[str, str | None] | None = None  # the platform ended the run: its final state and reason


@dataclass
class Submission:
    """What an attempt is submitted with: its number, environment (RAYPULSE_*: identity, checkpoints,
    resume point), the trace to join and the Ray job metadata."""

    attempt: int
    env: dict[str, str]
    traceparent: str | None
    trace_id: str | None


class Jobs(Protocol):
    """A run's attempts where its backend runs them: what the attempt engine (launcher/run.py) asks. The
    engine owns an attempt's life (stops, deadlines, a lost API, healing, bookkeeping, the run's end);
    this says how a job is submitted, what its status is, where its log comes from and how it is stopped.
    An attempt the backend names itself (`names_attempts` False) is known by the id its status gives."""

    address: str  # where the attempts go, as the journal says it
    names_attempts: bool  # True: attempt n is submitted as the engine's id for it (launcher/submission.py)
    retries_itself: bool  # True: the platform retries a failed attempt and enforces the deadlines itself
    restart_removes_pods: bool  # True: stopping to restart deletes the attempt's pods before stop() returns
    token: str | None  # the cluster's Ray token: an attempt's progress token derives from it

    def status(self, attempt: int, sid: str | None) -> Seen | None:
        """The attempt now (None: no such job, or not started yet). Raises ClusterLost when the backend
        does not answer (the engine decides when that ends the run)."""
        ...

    def submit(self, sid: str | None, submission: Submission) -> None:
        """Start the attempt (for a platform that retries itself: again, after the engine stopped one).
        Raises BadInput or InfraError; RunEnds when the run ends here instead."""
        ...

    def stop(self, attempt: int, sid: str | None, restart: bool, why: str | None) -> None:
        """Stop the attempt: for good (`restart` False), or to start the next one after a fault."""
        ...

    def stopping(self, restart: bool) -> str | None:
        """How a stop is done, for the journal's line (None: nothing to add)."""
        ...

    def follow_logs(self, attempt: int, sid: str | None, write: Callable[[str], None]) -> threading.Thread:
        """Stream the attempt's log to `write` as it comes; the thread ends with the log."""
        ...

    def logs(self, attempt: int, sid: str | None) -> str:
        """The attempt's whole log (once it ended: what it printed)."""
        ...


class RunEnds(Exception):
    """A backend's hook ends the run here (its final state and reason) instead of going on."""

    def __init__(self, state: str, reason: str | None) -> None:
        super().__init__(reason or state)
        self.state, self.reason = state, reason


@dataclass
class Placement:
    """A followed run's cluster, started or attached by its backend: its jobs, the dashboard (stacks),
    the exporters, the node remedy, and what happens to the cluster when the run ends."""

    jobs: Jobs
    dashboard: RayDashboard | None
    exporters: Exporters
    remedy: NodeRemedy
    local_processes: bool  # the job's processes run on this machine (their stacks can be taken here)

    @property
    def cluster(self) -> ClusterRecord | None:
        """The local cluster this run placed itself on, if any."""
        return None

    def on_running(self) -> None:
        """Called once the first attempt runs (a new local cluster starts its exporters then)."""

    def close(self, journal: Journal) -> None:
        """The run has ended (or is left to its cluster): tear down what the backend started for it."""

    def abort(self) -> None:
        """The first attempt could not be submitted: undo what the backend started for it."""


@dataclass
class NodeLogs:
    """What `launcher logs --all-nodes` saved: each node's (pod's) log under `directory`, the bytes, and what was
    cut to the one budget or not read (`summary` says it)."""

    directory: str
    cap_bytes: int
    pods: list[str] = field(default_factory=list)  # the nodes (pods) saved, in order
    written: int = 0
    cut: list[str] = field(default_factory=list)  # those whose log was cut to its end by the budget
    errors: list[str] = field(default_factory=list)  # `node: why` for each log not read

    @property
    def summary(self) -> str:
        text = f"{len(self.pods)} pod log(s), {self.written:,} bytes"
        if self.cut:
            shown = ", ".join(self.cut[:4]) + (" ..." if len(self.cut) > 4 else "")
            text += (f"; cut to the budget of {self.cap_bytes:,} bytes for all pods together, the end of each kept "
                     f"({shown})")
        if self.errors:
            text += f"; {len(self.errors)} not read ({self.errors[0]})"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "pods": self.pods, "bytes": self.written, "cap_bytes": self.cap_bytes,
                "cut": self.cut, "errors": self.errors, "summary": self.summary}


class Backend(Protocol):
    """One place a run can live. Class-level: its name (the spec's `backend`), the spec fields only it
    (and others that list them) takes, what it refuses, and how a recorded run's cluster is reached.
    Instance-level (bound to one spec by `resolve`): everything one command needs. What one backend
    cannot do is a capability it declares (`followed`), never a method that raises: a followed backend
    also implements `Followed`, one that is not implements `HandedOff`."""

    name: ClassVar[str]
    takes: ClassVar[frozenset[str]]  # backend-specific spec fields it honours
    followed: ClassVar[bool]  # False: its platform supervises the run (retries, deadlines), the launcher hands it off

    @classmethod
    def refusal(cls, spec: JobSpec) -> str | None:
        """What in the spec this backend cannot honour, past the fields it does not take (None: nothing)."""
        ...

    @staticmethod
    def reach(record: RunRecord, token_path: Path | None = None) -> JobsClient | None:
        """A Jobs API client for the cluster a recorded run used, while that cluster answers."""
        ...

    def describe(self) -> str:
        """How the run's first line names where it runs: `local, 2 worker(s)`."""
        ...

    def no_wait_refusal(self) -> str | None:
        """Why the run cannot be left to its cluster (--no-wait) (None: it can)."""
        ...

    def checkpoint_dir(self) -> str | None:
        """RAYPULSE_CHECKPOINT_DIR for every attempt; made and checked now where this machine can."""
        ...

    @classmethod
    def refresh(cls, record: RunRecord, token_path: Path | None = None) -> None:
        """A recorded, unfinished run's record brought up to what its cluster says, while that answers
        (`launcher status`); one nothing follows any more is finished here once its cluster ended it."""
        ...

    @classmethod
    def live_log(cls, record: RunRecord, attempt: int, write: Callable[[str], None], follow: bool,
                 token_path: Path | None = None) -> bool:
        """`launcher logs`: the attempt's log from its cluster, while that has it (False: it does not)."""
        ...

    @classmethod
    def node_logs(cls, record: RunRecord, token_path: Path | None = None) -> NodeLogs | None:
        """`launcher logs --all-nodes`: every node's log of the run saved under the run's directory, within one
        byte budget (None: the backend has no nodes' logs to gather; its driver log is `launcher logs`)."""
        ...

    @classmethod
    def stop_recorded(cls, record: RunRecord, token_path: Path | None = None) -> list[str]:
        """`launcher stop` of a recorded run: its unfinished attempts stopped and its launcher told not to
        retry (or, with none following it, stopped here). The submission ids (or names) stopped."""
        ...



class Followed(Backend, Protocol):
    """A backend whose runs the launcher follows (`followed`): `launcher.submit` places the run and the
    attempt engine drives it."""

    def run_record(self) -> RunRecord:
        """The record of an earlier submit of the run id that this submit continues, or a new one."""
        ...

    def place(self, journal: Journal, cancel: threading.Event, detach: bool) -> Placement:
        """Start or attach the run's cluster. Raises BadInput before anything starts when it cannot be used."""
        ...


class HandedOff(Backend, Protocol):
    """A backend whose platform supervises the run (not `followed`): its retries and deadlines are the
    platform's; the launcher hands the run to it and follows the platform's attempts with the same engine."""

    def hand_off(self, reporter: Reporter, cancel: threading.Event, detach: bool) -> RunRecord:
        """Hand the run to its platform, record it, and (unless `detach`) follow it to the platform's end
        of it. The run's record, with its exit code once ended."""
        ...


def new_record(spec: JobSpec, backend: str) -> RunRecord:
    """A new run's record; a stop asked of an earlier run with this id is not for this one."""
    assert spec.run_id is not None
    clear_stop(spec.run_id)
    return RunRecord(run_id=spec.run_id, name=spec.name, backend=backend, max_attempts=spec.max_attempts,
                     spec=spec.model_dump(mode="json"))


def unsupervised(record: RunRecord) -> bool:
    """No live launcher supervises the run (it was detached, or its launcher was killed): this process may
    act for it. The check takes the run's supervisor lock and gives it back at once."""
    if record.pid == os.getpid():
        return False  # this process supervises it (an API caller)
    try:
        claim_supervision(record)
    except BadInput:
        return False
    release_supervision(record.run_id)
    return True
