"""What a run needs from where it lives: the Backend protocol that local clusters, existing clusters
and KubeRay implement, and the Placement a followed run gets from its backend.

A backend is resolved once per command (launcher/backends/__init__.py `resolve`) and bound to the
spec it was resolved for. The rest of the launcher asks it (what it refuses, where checkpoints go,
how a cluster is started or attached, which exporters to read, how a faulty node is taken out, how
a recorded run's cluster is reached again) instead of comparing backend names.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from launcher.health.exporters import Target
from launcher.health.remedy import NodeRemedy
from launcher.jobs import JobsClient
from launcher.journal import Journal
from launcher.state import ClusterRecord, ExporterAccess, RunRecord, clear_stop

if TYPE_CHECKING:
    from launcher.display import Reporter
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


@dataclass
class Placement:
    """A followed run's cluster, started or attached by its backend: the Jobs API client, the
    exporters, the node remedy, and what happens to the cluster when the run ends."""

    client: JobsClient
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


class Backend(Protocol):
    """One place a run can live. Class-level: its name (the spec's `backend`), the spec fields only it
    (and others that list them) takes, what it refuses, and how a recorded run's cluster is reached.
    Instance-level (bound to one spec by `resolve`): everything one command needs."""

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

    def hand_off(self, reporter: Reporter, cancel: threading.Event, detach: bool) -> RunRecord:
        """For a backend that is not followed: hand the run to its platform, record it, and (unless
        `detach`) watch it to the platform's end of it. The run's record, with its exit code once ended."""
        ...

    def checkpoint_dir(self) -> str | None:
        """RAYPULSE_CHECKPOINT_DIR for every attempt; made and checked now where this machine can."""
        ...

    def run_record(self) -> RunRecord:
        """The record of an earlier submit of the run id that this submit continues, or a new one."""
        ...

    def place(self, journal: Journal, cancel: threading.Event, detach: bool) -> Placement:
        """Start or attach the run's cluster. Raises BadInput before anything starts when it cannot be used."""
        ...



def new_record(spec: JobSpec, backend: str) -> RunRecord:
    """A new run's record; a stop asked of an earlier run with this id is not for this one."""
    assert spec.run_id is not None
    clear_stop(spec.run_id)
    return RunRecord(run_id=spec.run_id, name=spec.name, backend=backend, max_attempts=spec.max_attempts,
                     spec=spec.model_dump(mode="json"))
