"""The launcher's Python API; the `launcher` command line is a thin layer over it.

    import launcher
    handle = launcher.submit({"name": "mnist", "entrypoint": "python train.py",
                              "worker_groups": [{"count": 2, "cpus": 1}]})
    handle.status().state        # PENDING, RUNNING, ... (refreshed from the cluster)
    record = handle.wait()       # follows retries and deadlines; tears a local cluster down
    record.exit_code             # launcher.ExitCode values

`submit` starts what the backend needs (a local cluster, or checks an existing one), submits the
first attempt (or finds it, by submission id) and returns; `wait` supervises the run to its end.
With no target in the spec, RAY_API_SERVER_ADDRESS / RAY_ADDRESS name an existing cluster, as for
`ray job submit` (launcher/target.py); `submit(spec, detach=True)` is `--no-wait` (launcher/detach.py).
With an OTLP endpoint (spec `otlp_endpoint` or OTEL_EXPORTER_OTLP_*), all of it is one trace
(launcher/tracing.py) that ends when the handle closes.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from exporter.contract import wire
from launcher import detach as detaching
from launcher import target
from launcher.backends.base import Followed, NodeLogs, Placement
from launcher.backends.kept import cluster_client
from launcher.backends.local.cluster import LocalCluster, forget_cluster, stop_cluster_processes
from launcher.backends.rayjobs import stop_attempts, stream_log
from launcher.backends.registry import BACKENDS, TARGETED, resolve, target_client
from launcher.display import Reporter
from launcher.errors import BadInput, Cancelled, InfraError
from launcher.exitcodes import FINAL_STATES, ExitCode
from launcher.health import stacks
from launcher.jobs import TERMINAL, JobsClient
from launcher.journal import Journal
from launcher.run import Run, job_view, seen_of, update_attempt
from launcher.runtime_env import is_remote
from launcher.spec import JobSpec, build_spec
from launcher.state import (
    ClusterRecord,
    RunRecord,
    claim_supervision,
    load_cluster,
    load_run,
    request_stop,
    run_dir,
    valid_name,
)
from launcher.tracing import RunTrace, traces_url

if TYPE_CHECKING:
    from launcher import recording
    from launcher.healing import Healing

JOB_STOP_TIMEOUT_S = 15.0  # `launcher down`: how long the cluster's jobs get to stop before its processes do


def as_spec(spec: JobSpec | Mapping[str, Any]) -> JobSpec:
    return spec if isinstance(spec, JobSpec) else build_spec(dict(spec))


def _check_local_paths(spec: JobSpec) -> JobSpec:
    """A local working dir and local py_modules are uploaded with each attempt: they must exist before
    anything starts, and are recorded as absolute paths (a later retry or `status` may run from elsewhere)."""
    update: dict[str, Any] = {}
    if spec.working_dir and not is_remote(spec.working_dir):
        path = Path(spec.working_dir).expanduser()
        if not path.is_dir():
            raise BadInput(f"working_dir: {spec.working_dir} is not a directory")
        update["working_dir"] = str(path.resolve())
    modules = []
    for number, module in enumerate(spec.runtime_env.py_modules):
        path = Path(module).expanduser()
        if not is_remote(module) and not (path.is_dir() or (path.is_file() and path.suffix in (".py", ".whl"))):
            raise BadInput(f"runtime_env.py_modules[{number}]: {module} is not a directory, .py or .whl file here; "
                           "local py_modules are uploaded from this machine with the job")
        modules.append(module if is_remote(module) else str(path.resolve()))
    if modules:
        update["runtime_env"] = spec.runtime_env.model_copy(update={"py_modules": modules})
    return spec.model_copy(update=update) if update else spec


def _healing(spec: JobSpec, journal: Journal, placement: Placement) -> Healing | None:
    """The run's health watcher: it reads the exporters the backend names and acts through its remedy."""
    if not spec.health.enabled:
        return None
    # The watcher and the recorder load only for a run that has them: not at every command's start
    # (numpy, the exporters' digest and /metrics parser are most of a `launcher` start-up otherwise).
    from launcher.healing import Healing
    from launcher.health.fleet import FleetReader
    from launcher.health.promql import PromqlReader

    exporters = placement.exporters
    source = spec.health.source  # spec.py: prometheus only with a Prometheus to read
    fleet = FleetReader(exporters.head_url, lambda: exporters.access) if source != "direct" else None
    promql = PromqlReader(spec.prometheus) if source == "prometheus" and spec.prometheus else None
    return Healing(spec.health, journal, exporters.targets, placement.remedy, placement.dashboard,
                   progress_url=exporters.progress_url, local_processes=placement.local_processes, fleet=fleet,
                   promql=promql)


def _recorder(spec: JobSpec, journal: Journal, placement: Placement) -> recording.Recorder | None:
    """The run's recording (launcher/recording.py), unless `record: off`. With the user's Prometheus
    (`prometheus:`), which keeps the run's series, only when `record: on` is asked for (reports read that
    Prometheus otherwise, and nothing is recorded twice); the record then asks it for the run's firing
    alerts and keeps their windows whole (launcher/record_alerts.py)."""
    if not spec.recorded:
        return None
    from launcher import recording  # see _healing: loaded for a recorded run only

    record = journal.record
    assert record is not None
    exporters = placement.exporters
    return recording.start(record.directory, exporters.sd_url, interval=spec.record_interval, access=exporters.access,
                           notify=lambda kind, details: journal.emit(kind, **details), meta={"run_id": record.run_id},
                           record_nodes=frozenset(spec.record_nodes), prometheus=spec.prometheus)


class RunHandle:
    """A submitted run: status(), logs(), stop(), wait(). Use it as a context manager (or call
    close()) so that a local cluster is torn down even when wait() is never reached."""

    def __init__(self, run: Run, placement: Placement, recorder: recording.Recorder | None = None) -> None:
        self._run = run
        self._placement = placement
        self._recorder = recorder

    @property
    def run_id(self) -> str:
        return self._run.record.run_id

    @property
    def record(self) -> RunRecord:
        return self._run.record

    @property
    def cluster(self) -> ClusterRecord | None:
        """The local cluster the run is on, while it is up."""
        return self._placement.cluster

    def status(self) -> RunRecord:
        """The run record with the current attempt refreshed from the cluster."""
        record, current = self._run.record, self._run.current
        if record.exit_code is None and current:
            seen = self._run.jobs.status(current, self._run.submission_id(current))
            if seen is not None and seen.submission_id is not None:
                update_attempt(record, current, seen)
        return record

    def logs(self, attempt: int | None = None) -> str:
        chosen = attempt or self._run.current
        return self._run.jobs.logs(chosen, self._run.submission_id(chosen))

    def stop(self) -> None:
        """Stop the current attempt; no retry follows. wait() then returns with state STOPPED."""
        self._run.stop()

    def wait(self) -> RunRecord:
        """Supervise the run to its end (retries, deadlines, stop) and close. The record's
        exit_code is the launcher's exit code for it."""
        try:
            with self._run.journal.run_trace.current():
                return self._run.wait()
        except InfraError as exc:
            return self._run.finish_with(ExitCode.INFRA_ERROR, str(exc))
        finally:
            self.close()

    def detach(self) -> RunRecord:
        """Leave the run to its cluster (`--no-wait`): nothing here follows it any more, and the handle
        closes (a kept local cluster stays up). `status`, `logs` and `stop` find the run later."""
        current = self._run.current
        self._run.journal.emit("run.detached", attempt=current, submission_id=self._run.submission_id(current))
        self.close()
        return self._run.record

    def close(self) -> None:
        """Tear down what the backend started for the run (a local cluster, unless kept) and end the run's trace."""
        journal, record = self._run.journal, self._run.record
        if self._recorder is not None:  # before the teardown: exporters going away are no news
            self._recorder.stop()
        journal.close(record.state)  # closed before the attempt ended: it is left as it is
        self._placement.close(journal)
        journal.run_trace.finish(record.state, record.reason, {"raypulse.exit_code": record.exit_code,
                                                               "raypulse.attempts": len(record.attempts)})

    def __enter__(self) -> RunHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def submit(spec: JobSpec | Mapping[str, Any], *, reporter: Reporter | None = None,
           cancel: threading.Event | None = None, follow_logs: bool = False, detach: bool = False) -> RunHandle:
    """Start the run: bring up what its backend needs and submit (or find) the current attempt.
    Raises BadInput before anything starts when the spec or target cannot be used. With `detach`
    (`--no-wait`) the run is left to its cluster once submitted: the handle is closed, and its
    record says nothing supervises the run (launcher/detach.py)."""
    reporter = reporter or Reporter()
    spec, taken = target.resolve(spec)
    if taken is not None:
        reporter.info(taken.note)
    spec = _check_local_paths(spec.with_run_id())
    if detach:
        spec = detaching.spec_for_no_wait(spec)
    resolved = resolve(spec)
    if not resolved.followed:
        raise BadInput(f"backend: {resolved.name} runs are handed off, not followed: `launcher submit --backend "
                       f"{resolved.name}` applies them (the backend's hand_off())")
    backend = cast(Followed, resolved)  # its capability says it has the followed part of the protocol
    cancel = cancel or threading.Event()
    checkpoint_dir = backend.checkpoint_dir()
    record = backend.run_record()
    claim_supervision(record)  # one live supervisor per run; a killed one's run is taken over
    # This process supervises the run now (a run submitted with --no-wait is followed from here on).
    record.pid, record.detached, record.max_attempts = os.getpid(), False, spec.max_attempts
    record.checkpoint_dir = checkpoint_dir
    run_trace = RunTrace(traces_url(spec.otlp_endpoint, os.environ), {
        "raypulse.run_id": spec.run_id, "raypulse.job_name": spec.name, "raypulse.backend": backend.name,
        "raypulse.max_attempts": spec.max_attempts}, warn=reporter.warn)
    record.trace_id = run_trace.trace_id
    journal = Journal(reporter, record, run_trace)
    try:
        with run_trace.current():
            handle = _start(spec, journal, backend, cancel, follow_logs, detach)
    except BaseException as exc:
        # A stop asked for while a call to the cluster failed (one that never answered, cut at its deadline):
        # the run was stopped, whatever the call said.
        stopped = isinstance(exc, Cancelled) or (cancel.is_set() and isinstance(exc, InfraError))
        state = record.state if record.exit_code is not None else (
            "STOPPED" if stopped else "BAD_INPUT" if isinstance(exc, BadInput) else "INFRA_ERROR")
        journal.close(state)
        run_trace.finish(state, str(exc) or type(exc).__name__)
        if stopped and not isinstance(exc, Cancelled):
            raise Cancelled(str(exc)) from exc
        raise
    if detach:
        handle.detach()
    return handle


def _start(spec: JobSpec, journal: Journal, backend: Followed, cancel: threading.Event, follow_logs: bool,
           detach: bool) -> RunHandle:
    """submit() past its checks: the cluster, then the first attempt (inside the run's trace)."""
    placement = backend.place(journal, cancel, detach)
    # A new local cluster's exporters start once the job runs: on a small machine their start-up
    # would otherwise compete with the job's (the run also starts them if it stays pending).
    recorder = None if detach else _recorder(spec, journal, placement)  # nothing follows a detached run
    run = Run(spec, placement.jobs, journal, cancel, follow_logs=follow_logs, on_running=placement.on_running,
              healing=_healing(spec, journal, placement), recorder=recorder)
    try:
        run.start()
    except BaseException:
        if recorder is not None:
            recorder.stop()
        journal.close("FAILED")
        placement.abort()
        raise
    return RunHandle(run, placement, recorder)


# --- clusters without a job ----------------------------------------------------------------------


def up(spec: JobSpec | Mapping[str, Any], *, reporter: Reporter | None = None,
       cancel: threading.Event | None = None) -> ClusterRecord:
    """Start a local cluster that stays until `down(name)`; jobs go to it with cluster=name."""
    spec = as_spec(spec)
    return LocalCluster(spec, spec.name, Journal(reporter), cancel, kept=True).start()


def down(name: str, *, reporter: Reporter | None = None) -> int:
    """Tear down a local cluster by name; returns how many processes needed SIGKILL."""
    record = load_cluster(name)
    if record is None:
        raise BadInput(f"cluster: no running local cluster named {name!r} (see `launcher list`)")
    journal = Journal(reporter)
    stopped = _stop_jobs(name)
    if stopped:
        journal.emit("cluster.jobs_stopped", cluster=name, stopped=stopped)
    started = time.monotonic()
    journal.emit("cluster.teardown", cluster=name)
    killed = stop_cluster_processes(record)
    forget_cluster(record)
    journal.emit("cluster.down", cluster=name, seconds=round(time.monotonic() - started, 2), killed=killed or None)
    return killed


def _stop_jobs(name: str, timeout: float = JOB_STOP_TIMEOUT_S) -> list[str]:
    """Stop a kept cluster's unfinished jobs through the Jobs API before its processes: the drivers
    end cleanly, the launchers following them record STOPPED (and do not retry) and close their log
    streams, which Ray's dashboard otherwise waits on until it is killed. Best effort: a cluster
    that does not answer is torn down all the same."""
    try:
        client = cluster_client(name)[1]
        unfinished = [job for job in client.list() if job.submission_id and job.status.value not in TERMINAL]
        for job in unfinished:
            run_id = (job.metadata or {}).get(wire.META_RUN_ID)
            if run_id and load_run(run_id) is not None:
                request_stop(run_id)
        stopping = [job.submission_id for job in unfinished if client.stop(job.submission_id)]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
                (details := client.details(job)) is not None and details.status.value not in TERMINAL
                for job in stopping):
            time.sleep(0.5)
    except (BadInput, InfraError, RuntimeError, OSError):
        return []
    for run_id in {(job.metadata or {}).get(wire.META_RUN_ID) for job in unfinished} - {None}:
        record = load_run(run_id)
        if record is not None and record.detached:
            # No launcher follows it: its record ends here, while the cluster still answers.
            with contextlib.suppress(BadInput, InfraError, RuntimeError, OSError):
                status(run_id)
    return stopping


# --- runs after the fact -------------------------------------------------------------------------


def _record_client(record: RunRecord, token_path: Path | None = None) -> JobsClient | None:
    """A client for the cluster the run used, if that cluster still answers (its backend knows how)."""
    backend = BACKENDS.get(record.backend)
    return backend.reach(record, token_path) if backend is not None else None


def runs_on_cluster(client: JobsClient) -> dict[str, RunRecord]:
    """Runs reconstructed from a cluster's jobs (their raypulse.* metadata), by run id. A job
    submitted without the launcher appears as a run named by its submission id."""
    runs: dict[str, RunRecord] = {}
    for job in sorted(client.list(), key=lambda item: item.start_time or 0):
        metadata = job.metadata or {}
        keys = _launcher_keys(metadata)
        if keys is None:  # not the launcher's job (or keys not as it writes them): a run of its own
            metadata, keys = {}, (job.submission_id or job.job_id or "?", 1, 1)
        run_id, attempt, max_attempts = keys
        run = runs.setdefault(run_id, RunRecord(
            run_id=run_id, name=metadata.get(wire.META_JOB_NAME, run_id), backend=TARGETED,
            address=client.address, max_attempts=max_attempts, created_at=(job.start_time or 0) / 1000))
        run.trace_id = metadata.get(wire.META_TRACE_ID) or run.trace_id  # the latest traced submit's
        update_attempt(run, attempt, seen_of(job))
    for run in runs.values():
        last = run.attempts[-1].status
        run.state = last if last in TERMINAL or last == "RUNNING" else "PENDING"
        if last in FINAL_STATES and (last != "FAILED" or len(run.attempts) >= run.max_attempts):
            run.exit_code = int(FINAL_STATES[last])
    return runs


_ATTEMPT_NUMBER = re.compile(r"[1-9][0-9]{0,3}")  # raypulse.attempt and .max_attempts, as the launcher writes them


def _launcher_keys(metadata: Mapping[str, str]) -> tuple[str, int, int] | None:
    """(run id, attempt, max attempts) of a job the launcher submitted, from its raypulse.* metadata; None
    for another job, and for one whose keys are not as the launcher writes them: anyone can set a job's
    metadata (`ray job submit --metadata-json`), and one such job must not break the listing for all."""
    run_id = metadata.get(wire.META_RUN_ID)
    numbers = [metadata.get(wire.META_ATTEMPT, "1"), metadata.get(wire.META_MAX_ATTEMPTS, "1")]
    if not run_id or not valid_name(run_id) or not all(_ATTEMPT_NUMBER.fullmatch(number) for number in numbers):
        return None
    return run_id, int(numbers[0]), int(numbers[1])


def status(run_id: str, *, address: str | None = None, cluster: str | None = None,
           token_path: Path | None = None) -> RunRecord:
    """The run as this machine recorded it, refreshed from its cluster while that answers; or,
    with address/cluster, as that cluster knows it."""
    if address or cluster:
        runs = runs_on_cluster(target_client(address, cluster, token_path))
        if run_id in runs:
            return runs[run_id]
        raise BadInput(f"run_id: the cluster has no job of run {run_id!r}")
    record = load_run(run_id)
    if record is None:
        raise BadInput(f"run_id: no run {run_id!r} is recorded here; give --address or --cluster to ask a cluster")
    backend = BACKENDS.get(record.backend)
    if record.exit_code is None and backend is not None:
        backend.refresh(record, token_path)
    return record


def logs(run_id: str, *, attempt: int | None = None, follow: bool = False, write: Callable[[str], None],
         address: str | None = None, cluster: str | None = None, token_path: Path | None = None) -> None:
    """Write an attempt's log (default: the latest): live from the cluster, or as saved."""
    record = status(run_id, address=address, cluster=cluster, token_path=token_path)
    if not record.attempts:
        raise BadInput(f"run_id: run {run_id!r} has no attempt yet")
    chosen = record.attempt(attempt) if attempt else record.attempts[-1]
    if chosen is None:
        raise BadInput(f"attempt: run {run_id!r} has attempts 1..{len(record.attempts)}")
    saved = record.attempt_log(chosen.attempt)
    if address or cluster:
        if stream_log(target_client(address, cluster, token_path), chosen.submission_id, write, follow):
            return
    else:
        backend = BACKENDS.get(record.backend)
        if backend is not None and backend.live_log(record, chosen.attempt, write, follow, token_path):
            return
    if not saved.exists():
        raise BadInput(f"run_id: the log of {chosen.submission_id} is neither on a reachable cluster nor saved here")
    write(saved.read_text())


def node_logs(run_id: str, *, token_path: Path | None = None) -> NodeLogs:
    """Every node's log of a recorded run saved under its directory (KubeRay: every Ray pod's), within one
    byte budget; BadInput where its backend has none to gather."""
    record = status(run_id, token_path=token_path)
    backend = BACKENDS.get(record.backend)
    gathered = backend.node_logs(record, token_path) if backend is not None else None
    if gathered is None:
        raise BadInput(f"--all-nodes: run {run_id!r} runs on the {record.backend} backend, whose nodes' logs stay "
                       "with Ray (on the nodes, under /tmp/ray/session_latest/logs); gathering them works for KubeRay "
                       f"runs; the driver's log: `launcher logs {run_id}`")
    return gathered


def stop(run_id: str, *, address: str | None = None, cluster: str | None = None,
         token_path: Path | None = None) -> list[str]:
    """Stop the run's unfinished attempts and tell its launcher not to retry. Returns the
    submission ids that were stopped."""
    record = load_run(run_id)
    if record is None and not (address or cluster):
        raise BadInput(f"run_id: no run {run_id!r} is recorded here; give --address or --cluster")
    if address or cluster:
        client = target_client(address, cluster, token_path)
        return stop_attempts(client, status(run_id, address=address, cluster=cluster, token_path=token_path), record)
    assert record is not None
    backend = BACKENDS.get(record.backend)
    return backend.stop_recorded(record, token_path) if backend is not None else stop_attempts(None, record, record)


def diagnose(run_id: str, *, live: bool | None = None, address: str | None = None, cluster: str | None = None,
             token_path: Path | None = None) -> list[stacks.Evidence]:
    """The stacks of the run's processes: taken now while its attempt runs on a reachable cluster
    (`live`; the default then), else those saved when a hang was found. Newest first."""
    record = status(run_id, address=address, cluster=cluster, token_path=token_path)
    client = target_client(address, cluster, token_path) if (address or cluster) else _record_client(record, token_path)
    current = record.attempts[-1] if record.attempts else None
    running = client is not None and current is not None and current.status == "RUNNING"
    if live or (live is None and running):
        if not running:
            raise BadInput(f"run_id: run {run_id!r} has no running attempt on a reachable cluster to take stacks of")
        details = client.details(current.submission_id)
        job = job_view(details) if details is not None else {}
        local = record.cluster is not None and load_cluster(record.cluster) is not None  # processes on this machine
        processes = stacks.job_processes(client.dashboard, job.get("job_id"), job.get("driver"),
                                         submission_id=current.submission_id, local=local)
        directory = run_dir(run_id) / "stacks" / f"live-{time.strftime('%Y%m%d-%H%M%S')}"
        return [stacks.collect(client.dashboard, processes, directory, local=local)]
    saved = sorted((run_dir(run_id) / "stacks").glob("*/summary.json"), key=lambda path: path.stat().st_mtime,
                   reverse=True)
    if not saved:
        raise BadInput(f"run_id: run {run_id!r} has no saved stacks (they are taken when a hang is found) and no "
                       "running attempt to take them from")
    return [stacks.load(path.parent) for path in saved]
