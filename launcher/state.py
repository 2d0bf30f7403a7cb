"""What the launcher remembers between commands, under $RAYPULSE_HOME (default ~/.raypulse):

    runs/<run_id>/run.json          the run: where it ran, its state and every attempt
    runs/<run_id>/attempt-<n>.log   each attempt's driver log, kept after the cluster is gone
    runs/<run_id>/stop              `launcher stop` asks the submitting process to stop (no retries)
    runs/<run_id>/supervisor.lock   flock'ed by the launcher process that supervises the run, while it lives
    clusters/<name>/cluster.json    a running local cluster: address, processes, exporters
    clusters/<name>/token           its Ray auth token (mode 0600)
    clusters/<name>/exporter-*      its exporters' web config and the launcher's password (exporter_web_config)
    deployments/<host_port>/        `launcher exporters deploy --web-config` to the cluster of that dashboard: how
                                    the launcher reaches those exporters (access.json, its password, their cert)
    audit.log                       JSON lines, one per action (launcher/audit.py)

A run id or cluster name is a directory name here and nothing else: checked with the rule `submit`
uses (spec.py), and its directory, links resolved, stays under $RAYPULSE_HOME (run_dir, cluster_dir).
Records are written whole and atomically (temp file + rename), so a reader never sees half of one.
Everything here is private to the user: files 0600, directories 0700 (write_private, private_dir),
and a file or directory an older launcher left looser is tightened when it is next written. Secrets
are not kept in records at all: a run's spec is saved with its environment variable values and
credential-looking arguments redacted (launcher/redact.py); nothing reads them back (a retry runs
in the launcher process that holds the spec, and a re-submission gives the spec again).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import http.client
import os
import re
import shutil
import ssl
import stat
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_serializer

from exporter.contract import wire
from launcher import redact
from launcher.errors import BadInput
from launcher.spec import MAX_RUN_ID, _dns_label

FILE_MODE = 0o600
DIR_MODE = 0o700
Loaded = TypeVar("Loaded")


def home() -> Path:
    return Path(os.environ.get(wire.ENV_HOME) or "~/.raypulse").expanduser()


def private_dir(path: Path) -> Path:
    """`path` as a directory (made with its parents if missing) that only this user can enter: it and
    every directory between it and $RAYPULSE_HOME (included) are 0700, tightened if they were looser.
    A directory outside $RAYPULSE_HOME (a checkpoint dir the user named) is made 0700 if new, else
    left as it is."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    root = home().absolute()
    target = path.absolute()
    for directory in (target, *target.parents):
        if directory != root and root not in directory.parents:
            break
        with contextlib.suppress(OSError):  # not ours (a shared parent): nothing to tighten
            if stat.S_IMODE(directory.stat().st_mode) != DIR_MODE and directory.stat().st_uid == os.getuid():
                directory.chmod(DIR_MODE)
        if directory == root:
            break
    return path


def _temp_beside(path: Path, mode: int) -> tuple[Path, int]:
    """A new temp file next to `path`, opened for writing without following a link (O_EXCL: a file
    or link planted under its name is removed first, never written through)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temp.unlink()
    return temp, os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def write_private(path: Path, text: str | bytes, mode: int = FILE_MODE) -> None:
    """Write a whole file atomically (temp file + rename) with `mode` (0600: this user only), in a
    private directory. The temp file is opened without following a link and replaced if it exists, so
    nothing another user planted is written through."""
    private_dir(path.parent)
    temp, fd = _temp_beside(path, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as handle:
            handle.write(text)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    os.replace(temp, path)


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[TextIO]:
    """A text file for a path the user named (`-o FILE`): written to a temp file beside it, with the
    user's umask, and renamed over `path` when the block ends without an error. A link at `path`
    is replaced, not written through."""
    temp, fd = _temp_beside(path, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    os.replace(temp, path)


def _named_dir(kind: str, name: str, field: str) -> Path:
    """$RAYPULSE_HOME/<kind>/<name> for a run id or cluster name as `submit` accepts them (so never
    `..` or a `/`), that stays under $RAYPULSE_HOME once links are resolved. BadInput otherwise:
    these names come from the command line and from records other programs could have written."""
    try:
        _dns_label(name, MAX_RUN_ID)
    except ValueError as exc:
        raise BadInput(f"{field}: {exc}") from None
    path = home() / kind / name
    root, resolved = home().resolve(), path.resolve()
    if not resolved.is_relative_to(root):
        raise BadInput(f"{field}: {path} leads to {resolved}, outside {root}; a {field.replace('_', ' ')} names "
                       f"a directory under {root / kind} only")
    return path


def valid_name(name: str) -> bool:
    """Whether `name` is a run id or cluster name as `submit` accepts them."""
    try:
        _dns_label(name, MAX_RUN_ID)
    except ValueError:
        return False
    return True


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


class ExporterAccess(BaseModel):
    """How the launcher reaches exporters it started under a web config (TLS, basic auth): the
    exporters' own certificate is the one it trusts (pinned: the host name is not checked, since the
    exporters listen on node IPs a certificate rarely names), and it authenticates as a user of its
    own, whose password it keeps 0600 beside the cluster record."""

    web_config: str | None = None  # the file local exporters were started with (--web-config)
    tls_trust_file: str | None = None  # the exporters' certificate (chain); None: plain HTTP
    username: str | None = None  # None: the web config has no basic auth
    password_file: str | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls_trust_file else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.tls_trust_file is None:
            return None
        context = ssl.create_default_context(cafile=self.tls_trust_file)
        context.check_hostname = False
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the leaf itself is a trust anchor
        return context

    def authorization(self) -> str | None:
        if self.username is None or self.password_file is None:
            return None
        password = Path(self.password_file).read_text().strip()
        return "Basic " + base64.b64encode(f"{self.username}:{password}".encode()).decode()

    def urlopen(self, request: str | urllib.request.Request, timeout: float) -> http.client.HTTPResponse:
        """urllib.request.urlopen with this trust and these credentials (never sent on a redirect)."""
        request = request if isinstance(request, urllib.request.Request) else urllib.request.Request(request)
        authorization = self.authorization()
        if authorization:
            request.add_unredirected_header("Authorization", authorization)
        return urllib.request.urlopen(request, timeout=timeout, context=self.ssl_context())


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
    exporter_access: ExporterAccess | None = None  # None: the exporters have no web config (plain HTTP)

    @property
    def directory(self) -> Path:
        return cluster_dir(self.name)

    def save(self) -> None:
        write_private(self.directory / "cluster.json", self.model_dump_json(indent=2))


def cluster_dir(name: str) -> Path:
    """The local cluster's directory; BadInput for a name `launcher up` would not take."""
    return _named_dir("clusters", name, "cluster")


def load_cluster(name: str) -> ClusterRecord | None:
    """The cluster's record; None when there is none, or when `name` cannot be a cluster's."""
    if not valid_name(name):
        return None
    try:
        return ClusterRecord.model_validate_json((cluster_dir(name) / "cluster.json").read_text())
    except FileNotFoundError:
        return None


def list_clusters() -> list[ClusterRecord]:
    root = home() / "clusters"
    records = [_listed(load_cluster, path.name) for path in sorted(root.iterdir())] if root.is_dir() else []
    return [record for record in records if record is not None]


def _listed(load: Callable[[str], Loaded | None], name: str) -> Loaded | None:
    """A record for a listing: one whose directory leads out of $RAYPULSE_HOME is left out."""
    try:
        return load(name)
    except BadInput:
        return None


def write_token(name: str, token: str) -> Path:
    path = cluster_dir(name) / "token"
    write_private(path, token)
    return path


def deployment_dir(address: str) -> Path:
    """Where `launcher exporters deploy` keeps what it needs to reach the exporters of the cluster
    whose dashboard is `address`."""
    netloc = urlsplit(address).netloc or address
    return home() / "deployments" / re.sub(r"[^A-Za-z0-9_.-]", "_", netloc.rpartition("@")[2])


def save_deployment_access(address: str, access: ExporterAccess) -> None:
    write_private(deployment_dir(address) / "access.json", access.model_dump_json(indent=2))


def load_deployment_access(address: str) -> ExporterAccess | None:
    try:
        return ExporterAccess.model_validate_json((deployment_dir(address) / "access.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def forget_deployment(address: str) -> None:
    shutil.rmtree(deployment_dir(address), ignore_errors=True)


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
    # Checkpoints as the watcher saw them (launcher/checkpoint_advice.py): the newest save's cost (its
    # slowest rank's), and (saves a rank made, the newest save's time) when first and last seen.
    checkpoint_seconds: float | None = None
    first_checkpoint: tuple[float, float] | None = None
    last_checkpoint: tuple[float, float] | None = None

    @property
    def checkpoint_interval_s(self) -> float | None:
        """The mean time between the saves seen; None before two were."""
        if self.first_checkpoint is None or self.last_checkpoint is None:
            return None
        saves = self.last_checkpoint[0] - self.first_checkpoint[0]
        return (self.last_checkpoint[1] - self.first_checkpoint[1]) / saves if saves > 0 else None


class EventRecord(BaseModel):
    """One event of the run's journal (launcher/journal.py): what changed, when, and the line shown."""

    time: float
    kind: str  # e.g. attempt.submitted, retry.scheduled, run.finished
    attempt: int | None = None
    message: str | None = None  # the line the launcher showed for it, if any
    details: dict[str, Any] = Field(default_factory=dict)

    @field_serializer("message")
    def _redacted_message(self, message: str | None) -> str | None:
        return redact.text(message) if message else message

    @field_serializer("details")
    def _redacted_details(self, details: dict[str, Any]) -> dict[str, Any]:
        return redact.details(details)


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
    detached: bool = False  # submitted with --no-wait: no process supervises it (launcher/detach.py)
    state: str = "STARTING"  # STARTING, PENDING, RUNNING, RETRYING, or a final state (exitcodes.FINAL_STATES)
    reason: str | None = None
    exit_code: int | None = None
    trace_id: str | None = None  # the OTLP trace of its latest submit (launcher/tracing.py), when traced
    created_at: float = Field(default_factory=time.time)
    finished_at: float | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    events: list[EventRecord] = Field(default_factory=list)  # the run's journal, oldest first
    spec: dict[str, Any] = Field(default_factory=dict)  # kept and shown redacted (launcher/redact.py)

    @field_serializer("spec")
    def _redacted_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        return redact.spec(spec)

    @property
    def directory(self) -> Path:
        return run_dir(self.run_id)

    def save(self) -> None:
        write_private(self.directory / "run.json", self.model_dump_json(indent=2))

    def attempt_log(self, attempt: int) -> Path:
        return self.directory / f"attempt-{attempt}.log"

    def attempt(self, number: int) -> AttemptRecord | None:
        return next((item for item in self.attempts if item.attempt == number), None)


def run_dir(run_id: str) -> Path:
    """The run's directory; BadInput for an id `submit` would not take (`../x`, `a/b`)."""
    return _named_dir("runs", run_id, "run_id")


def load_run(run_id: str) -> RunRecord | None:
    """The run's record; None when there is none, or when `run_id` cannot be a run's (an id from a
    cluster's job metadata, say). BadInput when its directory is a link out of $RAYPULSE_HOME."""
    if not valid_name(run_id):
        return None
    try:
        return RunRecord.model_validate_json((run_dir(run_id) / "run.json").read_text())
    except FileNotFoundError:
        return None


def list_runs() -> list[RunRecord]:
    root = home() / "runs"
    records = [_listed(load_run, path.name) for path in root.iterdir()] if root.is_dir() else []
    return sorted((record for record in records if record is not None), key=lambda record: -record.created_at)


def request_stop(run_id: str) -> None:
    write_private(run_dir(run_id) / "stop", f"{time.time()}\n")


# The supervision locks this process holds, by run id: an open file description each, so that the
# lock goes with the process however it ends (SIGKILL included) and nothing has to release it.
_SUPERVISED: dict[str, int] = {}


def claim_supervision(record: RunRecord) -> None:
    """Make this process the run's supervisor: an flock on runs/<id>/supervisor.lock, held until the
    process ends. BadInput, before anything starts, while another live launcher holds it (a second
    supervisor would retry and heal the same run beside it); a launcher that was killed held it no
    longer, so `launcher submit --run-id RUN` takes its run over."""
    if record.run_id in _SUPERVISED:
        return  # this process supervised it before (an API caller submitting the run again)
    path = private_dir(run_dir(record.run_id)) / "supervisor.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = f" (pid {record.pid})" if record.pid else ""
        raise BadInput(f"run_id: run {record.run_id} is supervised by a launcher that is still running{holder}; "
                       f"wait for it, `launcher stop {record.run_id}` to stop the run, or choose another "
                       "--run-id") from None
    _SUPERVISED[record.run_id] = fd


def release_supervision(run_id: str) -> None:
    """This process no longer supervises the run (it ended, or was left to its cluster)."""
    fd = _SUPERVISED.pop(run_id, None)
    if fd is not None:
        os.close(fd)


def clear_stop(run_id: str) -> None:
    (run_dir(run_id) / "stop").unlink(missing_ok=True)


def stop_requested(run_id: str) -> bool:
    return (run_dir(run_id) / "stop").exists()
